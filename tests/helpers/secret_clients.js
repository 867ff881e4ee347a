// Node.js clients for tests/tests/secrets.rs, each sending known secrets: a
// bearer token, a cookie, an API key header, a query string and a prompt in
// the body (NODE_TLS_REJECT_UNAUTHORIZED=0 for the tests' own certificate).
//
// usage: node secret_clients.js fetch|h2 BASE BEARER COOKIE API_KEY QUERY PROMPT REPLY
//   fetch  Node's fetch (undici), HTTP/1.1
//   h2     Node's http2 module (h2c with prior knowledge for http://)
// Prints one JSON line: its pid and whether the answer carried REPLY.
const http2 = require('http2');
const [mode, base, bearer, cookie, apiKey, query, prompt, reply] = process.argv.slice(2);

const path = `/v1/chat/completions?api_key=${query}`;
const body = JSON.stringify({
  model: `node-${mode}-model`,
  messages: [{ role: 'user', content: prompt }],
});

async function viaFetch() {
  const res = await fetch(base + path, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      authorization: `Bearer ${bearer}`,
      cookie: `session=${cookie}`,
      'x-api-key': apiKey,
    },
    body,
  });
  return res.text();
}

function viaH2() {
  return new Promise((resolve, reject) => {
    const session = http2.connect(base, { rejectUnauthorized: false });
    session.on('error', reject);
    const req = session.request({
      ':method': 'POST',
      ':path': path,
      'content-type': 'application/json',
      authorization: `Bearer ${bearer}`,
      cookie: `session=${cookie}`,
      'x-api-key': apiKey,
    });
    let text = '';
    req.setEncoding('utf8');
    req.on('data', (d) => { text += d; });
    req.on('error', reject);
    req.on('end', () => { session.close(); resolve(text); });
    req.end(body);
  });
}

(async () => {
  const text = mode === 'h2' ? await viaH2() : await viaFetch();
  console.log(JSON.stringify({ pid: process.pid, answers: 1, replied: text.includes(reply) }));
})().catch((e) => { console.error(e); process.exit(1); });
