// An HTTP/1.1 gateway of the tests' own (Node, one event loop) that calls
// its upstream over cleartext HTTP/2, every request a stream of one session
// opened at start-up: GET /x is asked upstream as GET /x and answered with
// the upstream's status and body. Prints "PORT n" when listening.
//
// usage: node h2_gateway.js PORT UPSTREAM_PORT
const http = require('http');
const http2 = require('http2');
const [port, upstream] = process.argv.slice(2).map(Number);

const session = http2.connect(`http://127.0.0.1:${upstream}`);
session.on('error', (e) => {
  console.error(e);
  process.exit(1);
});

http
  .createServer((req, res) => {
    const stream = session.request({ ':method': 'GET', ':path': req.url });
    const chunks = [];
    let status = 502;
    stream.on('response', (h) => {
      status = h[':status'];
    });
    stream.on('data', (c) => chunks.push(c));
    stream.on('end', () => {
      const body = Buffer.concat(chunks);
      res.writeHead(status, { 'content-type': 'text/plain', 'content-length': body.length });
      res.end(body);
    });
    stream.on('error', () => {
      res.writeHead(502);
      res.end();
    });
    stream.end();
  })
  .listen(port, '127.0.0.1', () => console.log(`PORT ${port}`));
