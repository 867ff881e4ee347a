#!/usr/bin/env python3
"""Records the fuzz targets' seed corpora from the tests' own traffic:
the tests' servers (tests/helpers: llm_shapes.py, llm_server.py,
h2_server.js, grpc_pair.py, dns_server.py, tls_server.py) and real
clients (curl, nghttp, grpcio, dig; TLS from OpenSSL, Python, curl and
Java), through a recording proxy, plus files of this host
(/proc/PID/maps, a small shared library, the deploy configs).

Run as root by `cargo xtask fuzz --seed` inside a network namespace of its
own (`unshare -n`: the DNS server takes port 53). Writes
fuzz/corpus/<target>/<name>; the files are kept in the repository.
`seed.py PART...` records only those parts (llm_shapes, llm_server, h2,
dns, files, tls).

A connection is written as calls (see observer/src/fuzzing.rs): each read
of the proxy from one side is one call, the client's view (its writes
control 0, its reads 1) and the server's (control bit 3 on its first call:
the owner is a server; its reads 1, writes 0). Time since the previous call
goes in control bits 4-7 (milliseconds, at most 15).
"""

import os
import select
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HELPERS = os.path.join(ROOT, "tests", "helpers")
CORPUS = os.path.join(ROOT, "fuzz", "corpus")


def write_seed(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def encode(calls):
    out = bytearray()
    for control, data in calls:
        # A longer read splits into calls of at most 65535 bytes.
        for i in range(0, max(len(data), 1), 0xFFFF):
            piece = data[i:i + 0xFFFF]
            out += bytes([control]) + struct.pack("<H", len(piece)) + piece
    return bytes(out)


def views(log):
    """(client's calls, server's calls) of a log of (from_client, ms, bytes)."""
    client, server = [], []
    last = None
    for from_client, t, data in log:
        step = 0 if last is None else min(15, int(t - last))
        last = t
        client.append(((step << 4) | (0 if from_client else 1), data))
        server.append(((step << 4) | (1 if from_client else 0), data))
    if server:
        c, d = server[0]
        server[0] = (c | 8, d)
    return client, server


def record(upstream_port):
    """A proxy on a free port to 127.0.0.1:upstream_port; returns (port,
    logs): each accepted connection's log, filled while it runs."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(16)
    logs = []

    def pump(c):
        u = socket.create_connection(("127.0.0.1", upstream_port))
        log = []
        logs.append(log)
        try:
            relay(c, u, log)
        except OSError:
            pass  # a reset (the tests' servers reset streams on purpose)
        c.close()
        u.close()

    def relay(c, u, log):
        ends = {c: u, u: c}
        open_ = {c, u}
        while open_:
            r, _, _ = select.select(list(open_), [], [], 10)
            if not r:
                break
            for s in r:
                data = s.recv(65536)
                if not data:
                    open_.discard(s)
                    try:
                        ends[s].shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    continue
                log.append((s is c, time.monotonic() * 1000, data))
                ends[s].sendall(data)

    def accept():
        while True:
            c, _ = ls.accept()
            threading.Thread(target=pump, args=(c,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return ls.getsockname()[1], logs


def start(cmd, ready):
    """A server; waits for its line starting with `ready` ("PORT n": n)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    while True:
        line = p.stdout.readline()
        if not line:
            raise SystemExit("%s ended before it was ready" % cmd)
        if line.startswith(ready):
            parts = line.split()
            return p, int(parts[1]) if len(parts) > 1 else None


def save_logs(target, prefix, logs):
    time.sleep(0.3)
    for i, log in enumerate(logs):
        client, server = views(log)
        write_seed(target, "%s-%d-client" % (prefix, i), encode(client))
        write_seed(target, "%s-%d-server" % (prefix, i), encode(server))


CHAT = b'{"model":"m1","stream":%s,"messages":[{"role":"user","content":"hi"}]}'
SHAPES = [
    ("openai", "/v1/chat/completions", CHAT),
    ("azure", "/openai/deployments/d1/chat/completions?api-version=2024-02-01", CHAT),
    ("responses", "/v1/responses", b'{"model":"m1","stream":%s,"input":"hi"}'),
    ("anthropic", "/v1/messages",
     b'{"model":"m1","stream":%s,"max_tokens":9,"messages":[{"role":"user","content":"hi"}]}'),
    ("ollama", "/api/chat", b'{"model":"m1","stream":%s,"messages":[{"role":"user","content":"hi"}]}'),
    ("gemini-sse", "/v1beta/models/m1:streamGenerateContent?alt=sse",
     b'{"contents":[{"parts":[{"text":"hi"}]}]%s}'),
    ("gemini", "/v1beta/models/m1:generateContent", b'{"contents":[{"parts":[{"text":"hi"}]}]%s}'),
]


def curl(port, path, body=None, extra=()):
    cmd = ["curl", "-s", "-o", "/dev/null", "--max-time", "10"] + list(extra)
    if body is not None:
        cmd += ["-H", "Content-Type: application/json", "--data-binary", body]
    cmd.append("http://127.0.0.1:%d%s" % (port, path))
    subprocess.run(cmd, check=False)


def body_of(template, stream):
    if b"%s}" in template and b"stream" not in template:
        return template % (b',"stream":true' if stream else b"")
    return template % (b"true" if stream else b"false")


def llm_shapes():
    for style in ["compact", "python", "pretty"]:
        for bytewise in [False, True]:
            args = ["--first-ms", "5", "--gap-ms", "1", "--chunks", "3", "--style", style]
            if bytewise:
                args.append("--byte-at-a-time")
            srv, port = start([sys.executable, os.path.join(HELPERS, "llm_shapes.py")] + args, "PORT")
            proxy, logs = record(port)
            for name, path, template in SHAPES:
                for stream in [True, False]:
                    if bytewise and not stream:
                        continue
                    curl(proxy, path, body_of(template, stream))
            sdk_calls(proxy)
            srv.kill()
            tag = "%s%s" % (style, "-bytewise" if bytewise else "")
            save_logs("http", "llm-" + tag, logs)
            gen_ai_seeds(tag, logs)


def sdk_calls(port):
    """The official SDKs' own requests (their headers, their bodies), with
    the python of the tests' virtual environment that has them."""
    python = os.environ.get("SEED_SDK_PYTHON")
    if not python:
        raise SystemExit("seed: SEED_SDK_PYTHON (a python with openai and anthropic) not set")
    for api in ["chat", "responses", "anthropic", "ollama-chat", "gemini-sse"]:
        for extra in [[], ["--no-stream"]]:
            subprocess.run([python, os.path.join(HELPERS, "sdk_client.py"), "--plain",
                            "--port", str(port), "--api", api, "--model", "m1"] + extra,
                           check=False, stdout=subprocess.DEVNULL, timeout=60)


def gen_ai_seeds(tag, logs):
    """The gen_ai target's view: the request's path, then its body (control
    0), then the answer's body (control 1; 2: an event stream, 4: chunked)."""
    for i, log in enumerate(logs):
        sent = b"".join(d for c, _, d in log if c)
        got = b"".join(d for c, _, d in log if not c)
        head, _, body = sent.partition(b"\r\n\r\n")
        path = head.split(b" ")[1] if b" " in head else b"/"
        ahead, _, abody = got.partition(b"\r\n\r\n")
        sse = b"text/event-stream" in ahead
        chunked = b"chunked" in ahead.lower()
        ctl = 1 | (2 if sse else 0) | (4 if chunked else 0)
        calls = [(0, path), (4 if b"chunked" in head.lower() else 0, body)]
        # The answer as the tests' server wrote it: in its reads' pieces.
        calls += [(ctl, abody)]
        write_seed("gen_ai", "llm-%s-%d" % (tag, i), encode(calls))


def llm_server():
    srv, port = start([sys.executable, os.path.join(HELPERS, "llm_server.py"),
                       "--first-ms", "5", "--gap-ms", "1", "--chunks", "4"], "PORT")
    proxy, logs = record(port)
    # Two requests on one keep-alive connection, a failure, a GET.
    body = CHAT % b"true"
    subprocess.run(["curl", "-s", "-o", "/dev/null", "-o", "/dev/null", "--max-time", "10",
                    "-H", "Content-Type: application/json", "--data-binary", body,
                    "http://127.0.0.1:%d/v1/chat/completions" % proxy,
                    "http://127.0.0.1:%d/v1/chat/completions" % proxy], check=False)
    curl(proxy, "/v1/chat/completions", b'{"model":"fail","messages":[]}')
    curl(proxy, "/health")
    srv.kill()
    save_logs("http", "llm-server", logs)


def h2():
    node = shutil.which("node") or shutil.which("nodejs")
    if node and shutil.which("nghttp"):
        srv, port = start([node, os.path.join(HELPERS, "h2_server.js"), "0", "1"], "PORT")
        proxy, logs = record(port)
        for path in ["/ok", "/reset", "/bye"]:
            subprocess.run(["nghttp", "-n", "http://127.0.0.1:%d%s" % (proxy, path)],
                           check=False, stderr=subprocess.DEVNULL, timeout=20)
        subprocess.run(["nghttp", "-n", "-m", "3", "http://127.0.0.1:%d/ok" % proxy],
                       check=False, stderr=subprocess.DEVNULL, timeout=20)
        srv.kill()
        save_logs("http2", "nghttp-node", logs)
    else:
        raise SystemExit("seed: node and nghttp are needed for the h2 seeds")
    python = os.environ.get("SEED_H2_PYTHON")
    if not python:
        raise SystemExit("seed: SEED_H2_PYTHON (a python with grpcio) not set")
    srv, port = start([python, os.path.join(HELPERS, "grpc_pair.py"), "server"], "PORT")
    proxy, logs = record(port)
    subprocess.run([python, os.path.join(HELPERS, "grpc_pair.py"), "client", str(proxy)],
                   check=False, stdout=subprocess.DEVNULL, timeout=60)
    srv.kill()
    save_logs("http2", "grpcio", logs)
    # The h2 target puts the preface itself before the first request bytes.
    for name in os.listdir(os.path.join(CORPUS, "http2")):
        path = os.path.join(CORPUS, "http2", name)
        data = open(path, "rb").read()
        if data[3:3 + 24] == b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n":
            # Keep the recorded form in the http target; strip it here.
            write_seed("http", "h2-" + name, data)
            n = struct.unpack("<H", data[1:3])[0] - 24
            data = bytes([data[0]]) + struct.pack("<H", n) + data[27:]
            open(path, "wb").write(data)


def dns():
    srv = subprocess.Popen([sys.executable, os.path.join(HELPERS, "dns_server.py")],
                           stdout=subprocess.PIPE, text=True)
    if srv.stdout.readline().strip() != "READY":
        raise SystemExit("the DNS server did not start")
    names = [("example.com", "A"), ("example.com", "AAAA"), ("nx.example.com", "A"),
             ("tc.example.com", "A"), ("a.very.long.name.of.many.labels.example.org", "MX")]
    up = ("127.0.0.1", 53)
    n = 0
    for name, qtype in names:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        dig = subprocess.Popen(["dig", "+tries=1", "+time=2", "-p", str(s.getsockname()[1]),
                                "@127.0.0.1", name, qtype], stdout=subprocess.DEVNULL)
        query, client = s.recvfrom(65535)
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        u.settimeout(3)
        u.sendto(query, up)
        answer = u.recv(65535)
        s.sendto(answer, client)
        dig.wait()
        write_seed("dns", "dig-%d-query" % n, query)
        write_seed("dns", "dig-%d-answer" % n, answer)
        n += 1
    srv.kill()


def files():
    # Processes of the host (kernel threads map nothing): a few of each kind.
    seen = set()
    for pid in sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int):
        try:
            maps = open("/proc/%s/maps" % pid, "rb").read()
            exe = os.path.basename(os.readlink("/proc/%s/exe" % pid))
        except OSError:
            continue
        if maps and exe not in seen and len(seen) < 8:
            seen.add(exe)
            write_seed("procmaps", exe, maps)
    for cfg in ["deploy/systemd/config.toml", "deploy/kubernetes/base/config.toml",
                "deploy/kubernetes/overlays/jaeger/config.toml"]:
        write_seed("config", cfg.replace("/", "-"), open(os.path.join(ROOT, cfg), "rb").read())
    write_seed("config", "yaml", b"prometheus_listen: 127.0.0.1:9464\notlp:\n  endpoint: http://c:4317\n")
    tmp = "/tmp/observer-seed"
    os.makedirs(tmp, exist_ok=True)
    # Small libraries with the probed names, as classify reads libssl and
    # libgnutls (their dynamic symbols survive -s).
    for name, fns in [("openssl", ["SSL_read", "SSL_write", "SSL_do_handshake", "SSL_read_ex"]),
                      ("gnutls", ["gnutls_record_recv", "gnutls_record_send", "gnutls_handshake"]),
                      ("libc", ["getaddrinfo", "gethostbyname2_r"])]:
        src = os.path.join(tmp, name + ".c")
        with open(src, "w") as f:
            f.writelines("int %s(void*a,void*b,int c){return c;}\n" % fn for fn in fns)
        out = os.path.join(tmp, name + ".so")
        subprocess.run(["cc", "-shared", "-fPIC", "-Os", "-s", "-o", out, src], check=True)
        write_seed("elf", name + ".so", open(out, "rb").read())
    go_tables(tmp)


def go_tables(tmp):
    """A Go program's function table (the smallest program's: 250 KB),
    build information and code, as the pclntab target reads them."""
    src = os.path.join(tmp, "main.go")
    with open(src, "w") as f:
        f.write("package main\n\nfunc main() {}\n")
    exe = os.path.join(tmp, "go-mini")
    env = dict(os.environ, GO111MODULE="off", GOCACHE=os.path.join(tmp, "gocache"))
    subprocess.run(["go", "build", "-ldflags=-s", "-o", exe, src], check=True, env=env)
    for section, name, limit in [(".gopclntab", "gopclntab", None),
                                 (".go.buildinfo", "buildinfo", None),
                                 (".text", "text", 4096)]:
        out = os.path.join(tmp, name)
        subprocess.run(["objcopy", "-O", "binary", "--only-section=" + section, exe, out], check=True)
        data = open(out, "rb").read()
        write_seed("pclntab", name, data[:limit] if limit else data)


def tls():
    """TLS handshakes as the packet programs see them (the tls_hello
    target): each read of the proxy is one segment, in the calls' form
    (control bit 0: the view's owner read it). A throwaway certificate for
    example.test, made here and removed; the clients send a fixed request
    and the server answers a fixed body, so the records hold nothing but
    test bytes under keys that lived for one connection."""
    tmp = "/tmp/observer-seed-tls"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                    "-nodes", "-days", "2", "-subj", "/CN=example.test", "-addext",
                    "subjectAltName=DNS:example.test", "-keyout", key, "-out", cert],
                   check=True, stderr=subprocess.DEVNULL)
    srv, port = start([sys.executable, os.path.join(HELPERS, "tls_server.py"),
                       "--cert", cert, "--key", key], "PORT")
    request = b"GET / HTTP/1.1\r\nHost: example.test\r\nConnection: close\r\n\r\n"

    def openssl(proxy, *flags):
        subprocess.run(["openssl", "s_client", "-connect", "127.0.0.1:%d" % proxy, "-quiet",
                        "-no_ign_eof"]
                       + list(flags), input=request, check=False, timeout=20,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def python(proxy, name, tls12=False):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        if tls12:
            ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        with socket.create_connection(("127.0.0.1", proxy), timeout=10) as raw:
            with ctx.wrap_socket(raw, server_hostname=name) as s:
                s.sendall(request)
                s.recv(65536)

    def curl(proxy, *flags):
        subprocess.run(["curl", "-sk", "-o", "/dev/null", "--max-time", "10", "--resolve",
                        "example.test:%d:127.0.0.1" % proxy] + list(flags)
                       + ["https://example.test:%d/" % proxy], check=False)

    runs = [
        ("openssl-13", lambda p: openssl(p, "-servername", "example.test")),
        ("openssl-13-nosni", lambda p: openssl(p, "-noservername")),
        ("openssl-12", lambda p: openssl(p, "-tls1_2", "-servername", "example.test")),
        ("python-13", lambda p: python(p, "example.test")),
        ("python-13-nosni", lambda p: python(p, None)),
        ("python-12", lambda p: python(p, "example.test", tls12=True)),
        ("curl-13", lambda p: curl(p)),
        ("curl-12", lambda p: curl(p, "--tls-max", "1.2")),
    ]
    for name, client in runs:
        proxy, logs = record(port)
        client(proxy)
        save_logs("tls_hello", name, logs)
    java(tmp, port)
    srv.kill()
    hello_retry(tmp, cert, key)
    shutil.rmtree(tmp, ignore_errors=True)


def hello_retry(tmp, cert, key):
    """A HelloRetryRequest: the client's one key share (X25519) is not of
    the server's one group (P-256)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = subprocess.Popen(["openssl", "s_server", "-accept", "127.0.0.1:%d" % port, "-cert", cert,
                            "-key", key, "-groups", "P-256", "-quiet"],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    proxy, logs = record(port)
    subprocess.run(["openssl", "s_client", "-connect", "127.0.0.1:%d" % proxy, "-quiet",
                    "-no_ign_eof", "-servername", "example.test", "-groups", "X25519:P-256"],
                   input=b"hello\n", check=False, timeout=20,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    srv.kill()
    save_logs("tls_hello", "openssl-hrr", logs)


def java(tmp, port):
    """Java's JSSE (helpers/TlsClient.java): no name for an address, its
    lone compatibility ChangeCipherSpec; TLS 1.3 and 1.2."""
    if not (shutil.which("java") and shutil.which("javac")):
        raise SystemExit("seed: java and javac are needed for the TLS seeds")
    subprocess.run(["javac", "-d", tmp, os.path.join(HELPERS, "TlsClient.java")], check=True)
    for name, flags in [("java-13", []), ("java-12", ["-Djdk.tls.client.protocols=TLSv1.2"])]:
        proxy, logs = record(port)
        subprocess.run(["java"] + flags + ["-cp", tmp, "TlsClient", str(proxy), "1", "seed"],
                       check=False, stdout=subprocess.DEVNULL, timeout=60)
        save_logs("tls_hello", name, logs)


def main():
    if os.geteuid() != 0:
        raise SystemExit("seed: run as root (cargo xtask fuzz --seed)")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    parts = {"llm_shapes": llm_shapes, "llm_server": llm_server, "h2": h2, "dns": dns,
             "files": files, "tls": tls}
    for name in sys.argv[1:] or parts:
        parts[name]()


if __name__ == "__main__":
    main()
