// A Node.js TLS client that times itself (Node carries its own OpenSSL).
// Usage: node tls_client.js PORT SERVERNAME. Prints one JSON line: pid,
// handshake (socket connected -> secureConnect), handshake_end (before
// tls.connect() -> secureConnect) and time from writing the request to the
// first response byte, by this process's clock.
const tls = require("tls");
const port = Number(process.argv[2]);
const servername = process.argv[3];
const now = () => Number(process.hrtime.bigint()) / 1e6;
let tConnect, tHandshake, tWrite;
const t0 = now();
const s = tls.connect({ host: "127.0.0.1", port, servername, rejectUnauthorized: false });
s.once("connect", () => { tConnect = now(); });
s.once("secureConnect", () => {
  tHandshake = now();
  tWrite = now();
  s.write("GET / HTTP/1.1\r\nHost: test\r\n\r\n");
});
s.once("data", () => {
  const ttfb = now() - tWrite;
  console.log(JSON.stringify({ pid: process.pid, handshake_ms: tHandshake - tConnect, handshake_end_ms: tHandshake - t0, ttfb_ms: [ttfb] }));
  s.end();
});
s.on("error", (e) => { console.error(e); process.exit(1); });
