// Decides whether build/ is the build of the current tree, so `npm start` (and the build
// wrangler dev runs itself) skips a minute-long rebuild when nothing changed.
//
// The stamp (build/.stamp.json) holds a hash of every input (each file under src/, Cargo.toml,
// Cargo.lock, the build scripts, and the tool versions) and a hash of every file build/ held
// right after that build. build/ is fresh only when both still match: a changed, added,
// removed or renamed source, another tool version, or a build/ altered since, rebuilds; a
// fresh clone has no stamp and builds.
//
//   node scripts/build_stamp.mjs check   exit 0 when fresh, 1 when a build is needed
//   node scripts/build_stamp.mjs clear   forget the stamp (before building)
//   node scripts/build_stamp.mjs write   record the stamp (after a successful build)
import { createHash } from "node:crypto";
import { execFileSync } from "node:child_process";
import { existsSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import path from "node:path";

const STAMP = ".stamp.json";
/** What a build reads besides src/: files or directories, relative to the root; absent ones are skipped. */
const INPUTS = ["src", "Cargo.toml", "Cargo.lock", "build.rs", ".cargo", "rust-toolchain", "rust-toolchain.toml", "scripts/build.sh", "scripts/setup.sh"];

function files(root, rel) {
  const full = path.join(root, rel);
  if (!existsSync(full)) return [];
  if (!statSync(full).isDirectory()) return [rel];
  return readdirSync(full).sort().flatMap((entry) => files(root, path.join(rel, entry)));
}

function hashFiles(root, list) {
  const hash = createHash("sha256");
  for (const rel of list) hash.update(`${rel}\0`).update(readFileSync(path.join(root, rel))).update("\0");
  return hash.digest("hex");
}

/** The versions of the tools the build runs (a new compiler or bindgen rebuilds). */
export function toolVersions(root) {
  const version = (cmd, args) => {
    try {
      return execFileSync(cmd, args, { cwd: root, encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] }).trim();
    } catch {
      return `${cmd}: none`;
    }
  };
  const bin = path.join(process.env.HOME ?? "", ".cargo/bin");
  return [
    version("rustc", ["--version"]),
    version(path.join(bin, "worker-build"), ["--version"]),
    version(path.join(bin, "wasm-bindgen"), ["--version"]),
    version(path.join(root, "node_modules/.bin/wasm-opt"), ["--version"]),
  ].join("\n");
}

/** Hash of the build's inputs under `root`, with `tools` (the tool versions) mixed in. */
export function inputsHash(root, tools) {
  return createHash("sha256").update(hashFiles(root, INPUTS.flatMap((rel) => files(root, rel)))).update(tools).digest("hex");
}

/** Hash of what build/ holds, the stamp excepted; null when there is no build/index.js. */
export function outputsHash(root) {
  if (!existsSync(path.join(root, "build/index.js"))) return null;
  return hashFiles(root, files(root, "build").filter((rel) => rel !== path.join("build", STAMP)));
}

/** Whether build/ is the build of the current inputs: {fresh, why}. */
export function check(root, tools = toolVersions(root)) {
  const file = path.join(root, "build", STAMP);
  if (!existsSync(file)) return { fresh: false, why: "no build stamp (first build)" };
  let stamp;
  try {
    stamp = JSON.parse(readFileSync(file, "utf8"));
  } catch {
    return { fresh: false, why: "unreadable build stamp" };
  }
  if (stamp.inputs !== inputsHash(root, tools)) return { fresh: false, why: "sources or tools changed since the last build" };
  if (stamp.outputs !== outputsHash(root)) return { fresh: false, why: "build/ changed since the last build" };
  return { fresh: true, why: "build/ is the build of the current sources" };
}

export function write(root, tools = toolVersions(root)) {
  const outputs = outputsHash(root);
  if (!outputs) throw new Error("build_stamp: no build/index.js to stamp");
  writeFileSync(path.join(root, "build", STAMP), JSON.stringify({ inputs: inputsHash(root, tools), outputs }) + "\n");
}

export function clear(root) {
  rmSync(path.join(root, "build", STAMP), { force: true });
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
  const command = process.argv[2];
  if (command === "check") {
    const { fresh, why } = check(root);
    console.error(`build: ${why}${fresh ? "; skipping (bash scripts/build.sh --force rebuilds)" : ""}`);
    process.exit(fresh ? 0 : 1);
  } else if (command === "write") write(root);
  else if (command === "clear") clear(root);
  else {
    console.error("usage: node scripts/build_stamp.mjs check|write|clear");
    process.exit(2);
  }
}
