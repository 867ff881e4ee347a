// Streamed chat completions through Node's fetch (undici), one pooled
// connection, timing itself. Usage: node fetch_client.js PORT MODEL...
// (TLS; NODE_TLS_REJECT_UNAUTHORIZED=0 for the tests' own certificate).
// Prints one JSON line per request: its pid, the time from the call to the
// answer's head (ttfb_ms) and to the first bytes carrying content (ttft_ms),
// the events counted, the status, the usage the server sent.
const [port, ...models] = process.argv.slice(2);

async function one(model) {
  const body = JSON.stringify({
    model,
    messages: [{ role: "user", content: "Say twenty words." }],
    stream: true,
  });
  const t0 = performance.now();
  const res = await fetch(`https://127.0.0.1:${port}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body,
  });
  const ttfb = performance.now() - t0;
  let ttft = null;
  let events = 0;
  let usage = null;
  let serverWait = null;
  let text = "";
  const dec = new TextDecoder();
  for await (const part of res.body) {
    const t = performance.now() - t0;
    const s = dec.decode(part, { stream: true });
    if (ttft === null && /"content":"[^"]/.test(s)) ttft = t;
    text += s;
  }
  for (const line of text.split("\n")) {
    if (!line.startsWith("data:")) continue;
    events += 1;
    const data = line.slice(5).trim();
    if (data !== "[DONE]") {
      const obj = JSON.parse(data);
      const fp = obj.system_fingerprint || "";
      if (serverWait === null && fp.startsWith("wait_ms=")) serverWait = parseFloat(fp.slice(8));
      if (obj.usage) usage = { input: obj.usage.prompt_tokens, output: obj.usage.completion_tokens };
    }
  }
  console.log(JSON.stringify({ pid: process.pid, model, status: res.status, ttfb_ms: ttfb, ttft_ms: ttft, events, usage, server_wait_ms: serverWait }));
}

(async () => {
  for (const m of models) await one(m);
})();
