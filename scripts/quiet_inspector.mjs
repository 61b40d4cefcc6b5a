// Keeps `wrangler dev`'s inspector from flooding while no DevTools is open. wrangler 4.86's
// inspector proxy asks the runtime for its Network events whether or not a DevTools is attached
// (cloudflare/workers-sdk#14191; fixed upstream in PR #14243, in wranglers that need Node 22),
// and hands every event it gets to wrangler's Node process as a debug log line, one local HTTP
// request each, whatever the log level, keeping it too in a buffer that only a DevTools drains.
// Every subrequest the worker makes is four or five events: with a batch's results (a download
// and 40 sends a chunk) that work cost more CPU than the worker's own, and the results went at
// half the rate of the same worker in Miniflare (docs/PERFORMANCE.md, "Through npm start").
//
// So `npm start` connects to the proxy as a DevTools client for a moment, sends
// `Network.disable` (and receives what the buffer held), and leaves: once the worker answers,
// and again every QUIET_EVERY_MS, since a reload (wrangler rebuilds on a change under src/)
// reconnects the runtime and the proxy enables the events again. A DevTools you open (`d` in
// wrangler's terminal, or chrome://inspect at the inspector port) sends its own
// `Network.enable`, so its Network tab works; while it is attached the proxy refuses a second
// client, so this leaves it alone.
import WebSocket from "ws";

/** How often the events are turned off again (after a reload the proxy turns them on). */
export const QUIET_EVERY_MS = 10_000;

/**
 * Connects to the inspector proxy at `port` (127.0.0.1), sends `Network.disable` and waits
 * for its answer, then disconnects. Resolves to "quiet", "busy" (a DevTools is attached) or
 * "unreachable" (no proxy there yet, or it did not answer within `timeoutMs`).
 */
export function quietOnce(port, { timeoutMs = 5_000 } = {}) {
  return new Promise((resolve) => {
    // No Origin and no User-Agent: the proxy takes such a client as a local one (as VS Code).
    const ws = new WebSocket(`ws://127.0.0.1:${port}/ws`, { headers: {} });
    const done = (how) => {
      clearTimeout(timer);
      ws.removeAllListeners();
      ws.on("error", () => {});
      ws.terminate();
      resolve(how);
    };
    const timer = setTimeout(() => done("unreachable"), timeoutMs);
    ws.on("open", () => ws.send(JSON.stringify({ id: 1, method: "Network.disable" })));
    ws.on("message", (m) => {
      try {
        if (JSON.parse(String(m)).id === 1) done("quiet");
      } catch { /* not ours */ }
    });
    ws.on("close", (code) => done(code === 1013 ? "busy" : "unreachable"));
    ws.on("error", () => done("unreachable"));
  });
}

/**
 * Turns the Network events off now and every `everyMs` until `stopped()` says so. `onFirst`
 * is called once, with the first answer that is not "unreachable".
 */
export async function keepQuiet(port, { stopped, everyMs = QUIET_EVERY_MS, onFirst = () => {} }) {
  let told = false;
  while (!stopped()) {
    const how = await quietOnce(port);
    if (!told && how !== "unreachable") {
      told = true;
      onFirst(how);
    }
    await new Promise((r) => setTimeout(r, told ? everyMs : 500).unref());
  }
}
