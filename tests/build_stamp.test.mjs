// The build stamp: `npm start` skips the wasm build only when build/ is the build of the
// current sources and tools. The decision is tested on a scratch tree (a real rebuild takes
// minutes); the last test runs the real scripts/build.sh on this tree, which `npm test` has
// just built, and checks it skips without touching build/.
import { describe, it, beforeEach, afterEach } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, mkdirSync, writeFileSync, rmSync, renameSync, statSync, readFileSync } from "node:fs";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import os from "node:os";
import { fileURLToPath } from "node:url";
import path from "node:path";
import { check, write, clear } from "../scripts/build_stamp.mjs";

const TOOLS = "rustc 1.95.0\nworker-build 0.8.7\nwasm-bindgen 0.2.130\nwasm-opt version 132";
let root;

function put(rel, text) {
  mkdirSync(path.dirname(path.join(root, rel)), { recursive: true });
  writeFileSync(path.join(root, rel), text);
}

/** A tree as a build leaves it: sources, then build/ and its stamp. */
beforeEach(() => {
  root = mkdtempSync(path.join(os.tmpdir(), "gemini-once-stamp-"));
  put("src/lib.rs", "pub fn a() {}\n");
  put("src/edge/mod.rs", "// edge\n");
  put("Cargo.toml", "[package]\nname = \"x\"\n");
  put("Cargo.lock", "# lock\n");
  put("scripts/build.sh", "worker-build --release\n");
  put("README.md", "docs\n");
  put("build/index.js", "export default {}\n");
  put("build/index_bg.wasm", "\0asm");
  write(root, TOOLS);
});
afterEach(() => rmSync(root, { recursive: true, force: true }));

const fresh = (tools = TOOLS) => check(root, tools).fresh;

describe("build stamp", () => {
  it("is fresh right after a build, and stays so when nothing the build reads changed", () => {
    assert.equal(fresh(), true);
    put("README.md", "other docs\n");
    put("tests/x.test.mjs", "// a test\n");
    assert.equal(fresh(), true);
  });

  it("a fresh clone (no stamp) or a cleared stamp builds", () => {
    clear(root);
    assert.equal(fresh(), false);
    assert.match(check(root, TOOLS).why, /no build stamp/);
  });

  for (const [what, change] of [
    ["a changed source", () => put("src/edge/mod.rs", "// edge, changed\n")],
    ["an added source", () => put("src/new.rs", "\n")],
    ["a removed source", () => rmSync(path.join(root, "src/lib.rs"))],
    ["a renamed source", () => renameSync(path.join(root, "src/lib.rs"), path.join(root, "src/lib2.rs"))],
    ["a changed Cargo.toml", () => put("Cargo.toml", "[package]\nname = \"y\"\n")],
    ["a changed Cargo.lock", () => put("Cargo.lock", "# lock 2\n")],
    ["a changed build script", () => put("scripts/build.sh", "worker-build --dev\n")],
    ["a new build.rs", () => put("build.rs", "fn main() {}\n")],
  ]) {
    it(`${what} rebuilds`, () => {
      change();
      assert.equal(fresh(), false);
      assert.match(check(root, TOOLS).why, /sources or tools changed/);
    });
  }

  it("another tool version rebuilds", () => {
    assert.equal(fresh(TOOLS.replace("0.2.130", "0.2.131")), false);
  });

  it("a build/ altered or removed since the build rebuilds", () => {
    put("build/index_bg.wasm", "\0asm altered");
    assert.equal(fresh(), false);
    assert.match(check(root, TOOLS).why, /build\/ changed/);
    write(root, TOOLS);
    assert.equal(fresh(), true);
    rmSync(path.join(root, "build/index.js"));
    assert.equal(fresh(), false);
  });

  it("scripts/build.sh skips an unchanged tree without touching build/", async (t) => {
    const real = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
    const env = { ...process.env, PATH: `${process.env.HOME}/.cargo/bin:${process.env.PATH}` };
    const probe = await promisify(execFile)("node", ["scripts/build_stamp.mjs", "check"], { cwd: real, env }).then(() => true, () => false);
    if (!probe) return t.skip("build/ is not the build of this tree (npm test builds it first)");
    const wasm = path.join(real, "build/index_bg.wasm");
    const before = { mtime: statSync(wasm).mtimeMs, bytes: readFileSync(wasm) };
    const run = await promisify(execFile)("bash", ["scripts/build.sh"], { cwd: real, env });
    assert.match(run.stderr, /build: build\/ is the build of the current sources; skipping/);
    assert.equal(statSync(wasm).mtimeMs, before.mtime);
    assert.deepEqual(readFileSync(wasm), before.bytes);
  });
});
