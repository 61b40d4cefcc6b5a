#!/usr/bin/env node
// The benchmark's former single file, kept as an entry point: the bench is in scripts/bench/
// (main.mjs holds its usage; `npm run bench -- --help`).
import "./bench/main.mjs";
