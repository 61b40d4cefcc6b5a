// The build's figures: wasm size raw and compressed, a wasm section parser (sections, the name
// section, code by crate), and the time from process start to the first answered request.
import { spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import zlib from "node:zlib";
import { freePort } from "../local_worker.mjs";

import { SELF, WRANGLER, children, killGroup, now, root, round, sleep } from "./common.mjs";
import { baseVars } from "./worker.mjs";
import { send } from "./load.mjs";

export async function benchBuild(dir, work, plan) {
  const wasm = fs.readFileSync(path.join(dir, "index_bg.wasm"));
  const js = fs.readFileSync(path.join(dir, "index.js"));
  const out = {
    wasm_raw_bytes: wasm.length,
    wasm_gzip_bytes: zlib.gzipSync(wasm).length,
    wasm_gzip9_bytes: zlib.gzipSync(wasm, { level: 9 }).length,
    wasm_brotli_bytes: zlib.brotliCompressSync(wasm).length,
    js_glue_bytes: js.length,
    js_glue_gzip_bytes: zlib.gzipSync(js).length,
    wasm_breakdown: wasmBreakdown(wasm),
  };
  // Without a name section (a stripped build), attribute code by crate from the named wasm
  // that cargo left in target/ (before wasm-bindgen and wasm-opt: sizes larger, shares indicative).
  const named = path.join(root, "target/wasm32-unknown-unknown/release/gemini_once.wasm");
  if (!out.wasm_breakdown.sections.some((x) => x.section === "custom:name") && fs.existsSync(named)) {
    const b = fs.readFileSync(named);
    out.named_wasm_breakdown = { path: path.relative(root, named), bytes: b.length, mtime: fs.statSync(named).mtime.toISOString(), ...wasmBreakdown(b) };
  }
  const stripped = stripCustomSections(wasm, (name) => name === "name");
  out.wasm_without_name_section_bytes = stripped.length;
  out.wasm_without_name_section_gzip_bytes = zlib.gzipSync(stripped).length;

  out.startup = { miniflare_process_ms: [], wrangler_dev_ms: [] };
  for (let i = 0; i < plan.startup_samples; i++) {
    out.startup.miniflare_process_ms.push(round(await timeToFirstAnswer([process.execPath, SELF, "--_serve", dir, JSON.stringify(WRANGLER)], root), 0));
  }
  if (plan.wrangler) {
    const wdir = path.join(work, "wrangler");
    fs.mkdirSync(wdir, { recursive: true });
    fs.cpSync(dir, path.join(wdir, "build"), { recursive: true });
    // The project's wrangler.toml without its [build] step (the build is already there).
    const toml = fs.readFileSync(path.join(root, "wrangler.toml"), "utf8")
      .replace(/^\[build\]\s*\ncommand\s*=.*\n/m, "");
    fs.writeFileSync(path.join(wdir, "wrangler.toml"), toml);
    fs.writeFileSync(path.join(wdir, ".dev.vars"), Object.entries(baseVars({})).map(([k, v]) => `${k}="${v}"`).join("\n") + "\n");
    const wrangler = path.join(root, "node_modules/wrangler/bin/wrangler.js");
    for (let i = 0; i < plan.startup_samples; i++) {
      const state = path.join(wdir, `state${i}`);
      const ms = await timeToFirstAnswer(
        [process.execPath, wrangler, "dev", "--ip", "127.0.0.1", "--persist-to", state, "--log-level", "error", "--port"],
        wdir,
        { WRANGLER_SEND_METRICS: "false" },
      );
      out.startup.wrangler_dev_ms.push(round(ms, 0));
    }
  }
  return out;
}

/** Spawns `argv` (with a free port appended) and polls GET /healthz until it answers 200. */
async function timeToFirstAnswer(argv, cwd, env = {}) {
  const port = await freePort();
  const t0 = now();
  const child = spawn(argv[0], [...argv.slice(1), String(port)], { cwd, env: { ...process.env, ...env }, stdio: ["pipe", "ignore", "pipe"], detached: true });
  children.add(child);
  let stderr = "";
  child.stderr.on("data", (c) => { if (stderr.length < 4000) stderr += c; });
  const base = new URL(`http://127.0.0.1:${port}`);
  let ms = null;
  try {
    while (now() - t0 < 60_000 && child.exitCode === null) {
      const r = await send(false, base, { path: "/healthz" });
      if (r.status === 200) {
        ms = now() - t0;
        break;
      }
      await sleep(10);
    }
  } finally {
    killGroup(child, "SIGTERM");
    await Promise.race([new Promise((r) => child.once("exit", r)), sleep(3000)]);
    killGroup(child, "SIGKILL");
    children.delete(child);
  }
  if (ms === null) throw new Error(`no answer from ${argv.slice(1, 3).join(" ")}: ${stderr}`);
  return ms;
}

/** Section sizes, the name section, and the largest functions by crate (from the name section). */
function wasmBreakdown(b) {
  let p = 8;
  const leb = () => { let r = 0, s = 0, x; do { x = b[p++]; r += (x & 0x7f) * 2 ** s; s += 7; } while (x & 0x80); return r; };
  const ids = { 1: "type", 2: "import", 3: "function", 4: "table", 5: "memory", 6: "global", 7: "export", 8: "start", 9: "element", 10: "code", 11: "data", 12: "datacount" };
  const sections = [];
  const bodies = [];
  const names = new Map();
  let imported = 0;
  while (p < b.length) {
    const id = b[p++];
    const size = leb();
    const start = p;
    let name = ids[id] ?? `id${id}`;
    if (id === 0) {
      const l = leb();
      name = `custom:${b.subarray(p, p + l).toString()}`;
      p += l;
      if (name === "custom:name") {
        while (p < start + size) {
          const sub = b[p++];
          const sl = leb();
          const end = p + sl;
          if (sub === 1) {
            const cnt = leb();
            for (let i = 0; i < cnt; i++) {
              const idx = leb();
              const nl = leb();
              names.set(idx, b.subarray(p, p + nl).toString());
              p += nl;
            }
          }
          p = end;
        }
      }
    } else if (id === 2) {
      const cnt = leb();
      for (let i = 0; i < cnt; i++) {
        p += leb(); // module
        p += leb(); // field
        const kind = b[p++];
        if (kind === 0) { leb(); imported++; }
        else if (kind === 1) { p++; const f = b[p++]; leb(); if (f & 1) leb(); }
        else if (kind === 2) { const f = b[p++]; leb(); if (f & 1) leb(); }
        else if (kind === 3) p += 2;
        else if (kind === 4) { p++; leb(); }
      }
    } else if (id === 10) {
      const cnt = leb();
      for (let i = 0; i < cnt; i++) {
        const sz = leb();
        bodies.push(sz);
        p += sz;
      }
    }
    sections.push({ section: name, bytes: size });
    p = start + size;
  }
  // wasm-bindgen's __wbindgen_describe_* exist only before wasm-bindgen runs; leave them out.
  const fns = bodies.map((bytes, i) => ({ bytes, name: names.get(i + imported) ?? `func[${i + imported}]` })).filter((f) => !f.name.startsWith("__wbindgen_describe"));
  const byCrate = new Map();
  for (const f of fns) {
    const c = crateOf(f.name);
    byCrate.set(c, (byCrate.get(c) ?? 0) + f.bytes);
  }
  const codeBytes = fns.reduce((a, x) => a + x.bytes, 0);
  return {
    sections,
    functions: fns.length,
    imported_functions: imported,
    code_bytes: codeBytes,
    by_crate: [...byCrate].map(([crate, bytes]) => ({ crate, bytes, share: round(bytes / codeBytes, 3) })).sort((a, b) => b.bytes - a.bytes),
    largest_functions: fns.sort((a, b) => b.bytes - a.bytes).slice(0, 15),
  };
}

/** The crate of a mangled Rust symbol (legacy `_ZN...` or v0 `_R...`), or null. */
function crateOfMangled(name) {
  const prim = (c) => (/^(f32|f64|u8|u16|u32|u64|u128|usize|i8|i16|i32|i64|i128|isize|bool|char|str)$/.test(c) ? "core (primitives)" : /^[A-Z]$/.test(c) ? "(generic impls)" : c);
  let m = /^_ZN(\d+)/.exec(name);
  if (m) {
    let seg = name.substr(m[0].length, Number(m[1]));
    seg = seg.replace(/^_?\$LT\$/, "").replace(/^(\$RF\$|mut\$u20\$|dyn\$u20\$)+/, "").replace(/^\$u5b\$/, "");
    const c = /^([A-Za-z_][A-Za-z0-9_]*)/.exec(seg)?.[1];
    return c ? prim(c) : "(other)";
  }
  if (name.startsWith("_R")) {
    for (const x of name.matchAll(/C(?:s[0-9A-Za-z]*_)?(\d+)/g)) {
      const ident = name.substr(x.index + x[0].length, Number(x[1]));
      if (/^[A-Za-z_][A-Za-z0-9_]*$/.test(ident)) return prim(ident);
    }
    return "(other)";
  }
  return null;
}

export function crateOf(name) {
  if (/^(func|wasm-function)\[\d+\]$/.test(name)) return "(unnamed)";
  const mangled = crateOfMangled(name);
  if (mangled) return mangled;
  if (/^__wbindgen|^__wbg_|^__externref/.test(name)) return "wasm_bindgen";
  // `a::b::c`, `<a::B as c::D>::e`, `<&mut a::B<R> as ...>`, `core[hash]::...`, `<f64 as ...>`
  const m = /^[<&\s]*(?:mut\s+|dyn\s+)?([A-Za-z_][A-Za-z0-9_]*)(?:\[[0-9a-f]+\])?(::|\s|>|$)/.exec(name);
  if (!m) return "(other)";
  const first = m[1];
  if (m[2] !== "::" || /^(f32|f64|u8|u16|u32|u64|u128|usize|i8|i16|i32|i64|i128|isize|bool|char|str)$/.test(first)) return "core (primitives)";
  if (/^func$/.test(first)) return "(unnamed)";
  return first;
}

function stripCustomSections(b, drop) {
  let p = 8;
  const leb = () => { let r = 0, s = 0, x; do { x = b[p++]; r += (x & 0x7f) * 2 ** s; s += 7; } while (x & 0x80); return r; };
  const parts = [b.subarray(0, 8)];
  while (p < b.length) {
    const at = p;
    const id = b[p++];
    const size = leb();
    const start = p;
    let keep = true;
    if (id === 0) {
      const l = leb();
      keep = !drop(b.subarray(p, p + l).toString());
    }
    if (keep) parts.push(b.subarray(at, start + size));
    p = start + size;
  }
  return Buffer.concat(parts);
}
