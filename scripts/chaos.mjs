#!/usr/bin/env node
// The chaos run's former single file, kept as an entry point: the run is in scripts/chaos/
// (main.mjs holds its usage; `npm run chaos -- --help`).
import "./chaos/main.mjs";
