//! An HTTPS server on hyper and tokio-rustls (rustls compiled in: no TLS
//! library for the observer to probe), HTTP/1.1 and HTTP/2 by ALPN, for
//! tests/tls_rustls.rs. Injected waits: inside each handshake (after the
//! ClientHello is read) and before each answer's header. Prints `PORT N`
//! once listening. `POST /v1/chat/completions` answers an OpenAI-style chat
//! completion with its token counts; anything else a short text. For
//! tests/secrets.rs: `--reply TEXT` is the completion's text (default "ok")
//! and `--set-cookie VALUE` a Set-Cookie header on every answer.
#![expect(clippy::unwrap_used, reason = "a test helper: a panic is a failure")]

use std::{convert::Infallible, sync::Arc, time::Duration};

use http_body_util::{BodyExt, Full};
use hyper::{body::Bytes, Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_rustls::LazyConfigAcceptor;

struct Args {
    cert: String,
    key: String,
    port: u16,
    handshake_ms: u64,
    answer_ms: u64,
    reply: String,
    set_cookie: Option<String>,
}

fn args() -> Args {
    let mut a = Args {
        cert: String::new(),
        key: String::new(),
        port: 0,
        handshake_ms: 0,
        answer_ms: 0,
        reply: "ok".into(),
        set_cookie: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--cert" => a.cert = v,
            "--key" => a.key = v,
            "--port" => a.port = v.parse().unwrap(),
            "--handshake-delay-ms" => a.handshake_ms = v.parse().unwrap(),
            "--answer-delay-ms" => a.answer_ms = v.parse().unwrap(),
            "--reply" => a.reply = v,
            "--set-cookie" => a.set_cookie = Some(v),
            _ => panic!("unknown argument {k}"),
        }
    }
    a
}

fn config(a: &Args) -> Arc<rustls::ServerConfig> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&a.cert)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(&a.key).unwrap();
    let mut c = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    c.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Arc::new(c)
}

const COMPLETION: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","model":"rustls-test-model","choices":[{"index":0,"message":{"role":"assistant","content":"REPLY"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}"#;

async fn answer(
    req: Request<hyper::body::Incoming>,
    wait: Duration,
    reply: Arc<str>,
    set_cookie: Option<Arc<str>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let chat = req.uri().path() == "/v1/chat/completions";
    // The whole request first: the wait is the server's own work.
    let _ = req.into_body().collect().await;
    tokio::time::sleep(wait).await;
    let (kind, body) = if chat {
        // The reply goes into the JSON as it is: the tests' are plain text.
        ("application/json", COMPLETION.replace("REPLY", &reply))
    } else {
        ("text/plain", "hello from rustls\n".to_string())
    };
    let mut b = Response::builder();
    if let Some(c) = set_cookie {
        b = b.header("set-cookie", &*c);
    }
    Ok(b.header("content-type", kind)
        .body(Full::new(Bytes::from(body)))
        .unwrap())
}

#[tokio::main]
async fn main() {
    let a = args();
    let config = config(&a);
    let listener = TcpListener::bind(("127.0.0.1", a.port)).await.unwrap();
    println!("PORT {}", listener.local_addr().unwrap().port());
    let hs = Duration::from_millis(a.handshake_ms);
    let wait = Duration::from_millis(a.answer_ms);
    let reply: Arc<str> = a.reply.as_str().into();
    let set_cookie: Option<Arc<str>> = a.set_cookie.as_deref().map(Into::into);
    loop {
        let (tcp, _) = listener.accept().await.unwrap();
        let config = config.clone();
        let (reply, set_cookie) = (reply.clone(), set_cookie.clone());
        tokio::spawn(async move {
            let Ok(start) = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), tcp).await
            else {
                return;
            };
            // The ClientHello is read: the injected handshake wait.
            tokio::time::sleep(hs).await;
            let Ok(tls) = start.into_stream(config).await else {
                return;
            };
            let service = hyper::service::service_fn(move |r| {
                answer(r, wait, reply.clone(), set_cookie.clone())
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
    }
}
