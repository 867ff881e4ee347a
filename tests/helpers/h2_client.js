// Node's http2 module: GETs of each path, one after another, on one session
// (h2c with prior knowledge for http://, ALPN h2 for https://). Per request a
// JSON line with its own times: ttfb_ms from request() to the response
// headers; rst_code: the stream's RST_STREAM code (0: none).
//
// usage: node h2_client.js URL_BASE PATH...
const http2 = require('http2');
const [base, ...paths] = process.argv.slice(2);

const session = http2.connect(base, { rejectUnauthorized: false });
session.on('error', (e) => { console.error(e); process.exit(1); });

function get(path) {
  return new Promise((resolve, reject) => {
    const t0 = process.hrtime.bigint();
    const req = session.request({ ':path': path });
    let ttfb = null;
    let status = null;
    req.on('response', (h) => {
      ttfb = Number(process.hrtime.bigint() - t0) / 1e6;
      status = h[':status'];
    });
    req.on('data', () => {});
    // A stream the server resets ends in 'close' with its code, after an
    // 'error' for most codes.
    req.on('error', () => {});
    req.on('close', () => resolve({
      pid: process.pid,
      local_port: session.socket.localPort,
      stream_id: req.id,
      path,
      status,
      ttfb_ms: ttfb,
      rst_code: req.rstCode,
    }));
    req.end();
  });
}

(async () => {
  let out = '';
  for (const p of paths) out += JSON.stringify(await get(p)) + '\n';
  session.destroy();
  // After a server's GOAWAY, Node keeps the destroyed session's socket as a
  // live handle: leave once the lines are written.
  process.stdout.write(out, () => process.exit(0));
})().catch((e) => { console.error(e); process.exit(1); });
