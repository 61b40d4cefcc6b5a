// A batch's results file as Gemini serves it at `/download/v1beta/{files/...}:download?alt=media`
// (../shared/GEMINI_WEBHOOKS.md §3c), for the local stand-ins: the Gemini stub, the chaos run and
// the bench. JSONL, one line per request: `{"key":...,"response":{...}}` or
// `{"key":...,"error":{...}}`. A file is {size, slice(start) -> async iterable of Buffers}, so a
// large one is generated as it streams and never held; `serveFile` honours `Range: bytes=N-`
// (and `bytes=N-M`) with 206, as the worker's resumed reading asks.
import { Readable } from "node:stream";

/** A Gemini `GenerateContentResponse` whose text is `text`. */
export function response(text) {
  return {
    candidates: [{ content: { parts: [{ text }], role: "model" }, finishReason: "STOP", index: 0 }],
    usageMetadata: { promptTokenCount: 12, candidatesTokenCount: 9, totalTokenCount: 21 },
    modelVersion: "gemini-3.8-flash",
  };
}

/** A request's error, as a batch's line carries it. */
export function failure(message, code = 3) {
  return { code, message, status: "INVALID_ARGUMENT" };
}

/** The demo batch's results: a few requests with keys, one of them failed. */
export function demoResults() {
  return [
    { key: "review-1", response: response("The first page reads well; tighten the intro.") },
    { key: "review-2", response: response("Two broken links on the pricing page.") },
    { key: "review-3", error: failure("stub: request review-3 named no model input") },
    { key: "review-4", response: response("Nothing to change.") },
  ];
}

/** A file held in memory: its lines, one JSON value each (or a string written as it is). */
export function memoryFile(lines) {
  const bytes = Buffer.from(lines.map((l) => (typeof l === "string" ? l : JSON.stringify(l)) + "\n").join(""));
  return {
    size: bytes.length,
    lines: lines.length,
    async *slice(start, end = bytes.length) {
      yield bytes.subarray(start, end);
    },
  };
}

/**
 * A generated file of `lines` lines of exactly `lineBytes` bytes each (with the newline), so a
 * byte offset maps to a line and any range is generated as it streams. Line i has key
 * `${prefix}${i}`; every `errorEvery`th line (when set) is an error.
 */
export function generatedFile({ lines, lineBytes = 1024, prefix = "req-", errorEvery = 0 }) {
  const line = (i) => {
    const head = errorEvery && i % errorEvery === errorEvery - 1
      ? { key: `${prefix}${i}`, error: failure(`generated error ${i}`) }
      : { key: `${prefix}${i}`, response: response("") };
    const bare = JSON.stringify(head);
    const pad = lineBytes - 1 - bare.length;
    if (pad < 0) throw new Error(`a line of ${lineBytes} bytes cannot hold ${bare.length}`);
    if (head.error) return Buffer.from(JSON.stringify({ ...head, error: { ...head.error, message: head.error.message + " ".repeat(pad) } }) + "\n");
    return Buffer.from(JSON.stringify({ ...head, response: response("x".repeat(pad)) }) + "\n");
  };
  const size = lines * lineBytes;
  return {
    size,
    lines,
    async *slice(start, end = size) {
      const BATCH = 64;
      for (let i = Math.floor(start / lineBytes); i * lineBytes < end; i += BATCH) {
        const parts = [];
        for (let j = i; j < Math.min(i + BATCH, lines); j++) parts.push(line(j));
        let buf = Buffer.concat(parts);
        const from = Math.max(0, start - i * lineBytes);
        const to = Math.min(buf.length, end - i * lineBytes);
        buf = buf.subarray(from, to);
        if (buf.length) yield buf;
      }
    },
  };
}

/** The byte range `Range` asks of a file of `size` bytes: {start, end} (end exclusive), null for the whole file, or "unsatisfiable". */
export function askedRange(header, size) {
  const m = /^bytes=(\d+)-(\d*)$/.exec(header ?? "");
  if (!m) return null;
  const start = Number(m[1]);
  const end = m[2] === "" ? size : Math.min(size, Number(m[2]) + 1);
  if (start >= size || end <= start) return "unsatisfiable";
  return { start, end };
}

/** Answers `req` with `file`, honouring its `Range` (206), as Gemini's download answers. */
export function serveFile(req, res, file) {
  const range = askedRange(req.headers.range, file.size);
  if (range === "unsatisfiable") {
    res.writeHead(416, { "content-range": `bytes */${file.size}` });
    return res.end();
  }
  const { start, end } = range ?? { start: 0, end: file.size };
  const headers = { "content-type": "application/octet-stream", "content-length": String(end - start), "accept-ranges": "bytes" };
  if (range) headers["content-range"] = `bytes ${start}-${end - 1}/${file.size}`;
  res.writeHead(range ? 206 : 200, headers);
  const body = Readable.from(file.slice(start, end));
  body.on("error", () => res.destroy());
  res.on("close", () => body.destroy());
  body.pipe(res);
}
