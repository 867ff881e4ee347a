// A cleartext HTTP/2 server of the tests' own (Node's http2 module), to
// break streams and connections on purpose:
//   /ok     answers 200 "ok" after WAIT_MS (any other path too)
//   /reset  sends its 200 head and a little body, then after 30 ms destroys
//           the stream: RST_STREAM (INTERNAL_ERROR, 2)
//   /bye    answers 200, then GOAWAY (NO_ERROR) on its connection
// Prints "PORT n" when listening.
//
// usage: node h2_server.js PORT WAIT_MS
const http2 = require('http2');
const [port, waitMs] = process.argv.slice(2).map(Number);

const server = http2.createServer();
server.on('stream', (stream, headers) => {
  stream.on('error', () => {});
  const path = headers[':path'];
  if (path === '/reset') {
    stream.respond({ ':status': 200, 'content-type': 'text/plain' });
    stream.write('partial');
    setTimeout(() => stream.destroy(new Error('broken on purpose')), 30);
  } else if (path === '/bye') {
    stream.respond({ ':status': 200, 'content-type': 'text/plain' });
    stream.end('bye');
    stream.session.goaway(http2.constants.NGHTTP2_NO_ERROR);
  } else {
    const since = process.hrtime.bigint();
    afterAtLeast(since, waitMs, () => {
      stream.respond({ ':status': 200, 'content-type': 'text/plain' });
      stream.end('ok');
    });
  }
});

// Calls `then` once `ms` have passed since `since` by the monotonic clock:
// a timer alone may fire up to a millisecond early (libuv counts from its
// loop's cached time, in whole milliseconds), and tests take the wait as a
// lower bound.
function afterAtLeast(since, ms, then) {
  const left = ms - Number(process.hrtime.bigint() - since) / 1e6;
  if (left <= 0) {
    then();
  } else {
    setTimeout(() => afterAtLeast(since, ms, then), Math.ceil(left));
  }
}
server.listen(port, '127.0.0.1', () => console.log(`PORT ${server.address().port}`));
