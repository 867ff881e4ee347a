#!/usr/bin/env python3
"""Where the observer's cost per request goes, by kernel symbol.

The throughput ratios of `cargo xtask bench` move by 0.1 between rounds on a
noisy VM, and cannot say which part of the observer costs what. This script
samples every CPU (`perf record -e cpu-clock -a`) during a wrk load against a
private nginx, once without the observer and once under `observer run`, and
counts the samples of the code that only runs because the observer is loaded:
the tracepoint dispatch, the cgroup_skb dispatch, the programs themselves, and
the helpers and maps they call. Those are direct costs: they do not depend on
the other run's noise, only on this run's CPU speed, so each is shown against
the same pair's baseline CPU per request.

Needs root, nginx, wrk, openssl, perf (Debian: linux-perf) and a built
target/release/observer (`cargo xtask build --release`). Not part of the
test suite. See bench/NOTES.md, "Where a keep-alive request's cost goes".

    python3 bench/cost_breakdown.py [--pairs 2] [--seconds 4] [--scheme https|http]
        [--close] [--top N] [--observer-args "..."]

--close sends `Connection: close` (a new connection per request, the churn
workloads); --top prints the N symbols whose time per request grew most.
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PORTS = {"http": 18180, "https": 18543}

# Symbols that exist on the request path only while the observer's programs
# are attached (kernel 6.18 names; a kernel that inlines one of them moves its
# samples into its caller, which is not counted: the figures are then low).
GROUPS = [
    ("tracepoint dispatch", r"^(bpf_trace_run\d|call_trace_sock_|__bpf_trace_sock_)"),
    # A classic tracepoint builds its trace record before the program runs
    # (a raw tracepoint does not): bpf_stats leaves this out of a program's time.
    ("trace records", r"^(perf_trace_|trace_call_bpf$|perf_trace_buf_alloc$|perf_swevent_get_recursion)"),
    ("cgroup_skb dispatch", r"^(__cgroup_bpf_run_filter_skb|__bpf_prog_run_save_cb)$"),
    ("programs", r"^bpf_prog_"),
    (
        "helpers and maps",
        r"^(bpf_sk_storage_get|bpf_local_storage_|lookup_nulls_elem_raw|htab_|__htab_|"
        r"bpf_lru_|bpf_ringbuf_|bpf_ktime_|bpf_probe_read|bpf_get_current_)",
    ),
]


def need(tool):
    if shutil.which(tool) is None:
        sys.exit(f"cost_breakdown: `{tool}` is not installed")


def start_nginx(d):
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-days", "2", "-subj", "/CN=localhost",
         "-keyout", f"{d}/key.pem", "-out", f"{d}/cert.pem"],
        check=True, capture_output=True)
    os.makedirs(f"{d}/tmp", exist_ok=True)
    with open(f"{d}/nginx.conf", "w") as f:
        f.write(f"""worker_processes 1; daemon off; master_process on; user root;
pid {d}/nginx.pid; error_log {d}/error.log warn;
events {{ worker_connections 10000; }}
http {{
  access_log off; keepalive_requests 10000000; keepalive_timeout 300s;
  client_body_temp_path {d}/tmp; proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp;
  uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;
  server {{
    listen 127.0.0.1:{PORTS['http']}; listen 127.0.0.1:{PORTS['https']} ssl;
    ssl_certificate {d}/cert.pem; ssl_certificate_key {d}/key.pem; ssl_protocols TLSv1.3;
    location / {{ return 200 "ok\\n"; }}
  }}
}}
""")
    p = subprocess.Popen(["nginx", "-c", f"{d}/nginx.conf", "-p", d],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        if subprocess.run(["curl", "-sk", "-o", "/dev/null", f"http://127.0.0.1:{PORTS['http']}/"]).returncode == 0:
            return p
        time.sleep(0.1)
    sys.exit("cost_breakdown: nginx did not start")


def start_observer(args=()):
    p = subprocess.Popen([f"{ROOT}/target/release/observer", "run", *args],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        if line.startswith("ready"):
            # Keep reading stderr so the observer never blocks on it.
            threading.Thread(target=p.stderr.read, daemon=True).start()
            return p
    p.wait()
    sys.exit(f"cost_breakdown: the observer exited (status {p.returncode}) before it was ready")


def stop(p):
    p.send_signal(signal.SIGINT)
    p.wait(timeout=30)


def measure(url, secs, out, close):
    """wrk for secs + 2 s, perf on every CPU for the middle secs; req/s."""
    header = ["-H", "Connection: close"] if close else []
    wrk = subprocess.Popen(["wrk", "-t1", "-c16", f"-d{secs + 2}s", *header, url],
                           stdout=subprocess.PIPE, text=True)
    time.sleep(1)
    # No workload for perf to start: the observer holds the first process of
    # an executable at its exec (SIGSTOP until probed), and perf record takes
    # its workload's stop for its end (SIGCHLD) and stops sampling at once.
    perf = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-F", "4000", "-a",
                             "-o", out],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(secs)
    perf.send_signal(signal.SIGINT)
    perf_err = perf.communicate()[1]
    text = wrk.communicate()[0]
    # perf ends by raising the SIGINT it was stopped with.
    if perf.returncode not in (0, -signal.SIGINT):
        sys.exit(f"cost_breakdown: perf record failed ({perf.returncode}): {perf_err.strip()}")
    m = re.search(r"Requests/sec:\s+([\d.]+)", text)
    if not m:
        sys.exit(f"cost_breakdown: wrk printed no rate:\n{text}")
    return float(m.group(1))


def symbols(data):
    """Sampled time (ns) per symbol."""
    r = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "sym",
                        "-g", "none", "-F", "period,sym"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"cost_breakdown: perf report failed: {r.stderr.strip()}")
    out = r.stdout
    per = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 3 and f[0].isdigit():
            # "[k] name" or "[.] name"
            name = " ".join(f[2:])
            per[name] = per.get(name, 0) + int(f[0])
    return per


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--seconds", type=int, default=4)
    ap.add_argument("--scheme", choices=["https", "http"], default="https")
    ap.add_argument("--close", action="store_true", help="a new connection per request")
    ap.add_argument("--top", type=int, default=0, help="symbols that grew most per request")
    ap.add_argument("--observer-args", default="", help="added to `observer run`")
    a = ap.parse_args()
    if a.pairs < 1 or a.seconds < 1:
        ap.error("--pairs and --seconds must be at least 1")
    if os.geteuid() != 0:
        sys.exit("cost_breakdown: run as root (perf -a and the observer need it)")
    for t in ("nginx", "wrk", "perf", "openssl", "curl"):
        need(t)
    if not os.path.exists(f"{ROOT}/target/release/observer"):
        sys.exit("cost_breakdown: build first: cargo xtask build --release")
    url = f"{a.scheme}://127.0.0.1:{PORTS[a.scheme]}/"
    d = tempfile.mkdtemp(prefix="observer-cost-")
    nginx = start_nginx(d)
    try:
        kind = "new connection per request" if a.close else "keep-alive"
        print(f"{a.scheme} {kind}, wrk 1 thread 16 connections, {a.seconds} s sampled per run")
        for i in range(a.pairs):
            runs = {}
            # Alternate which side goes first, so neither always meets a warmer machine.
            for mode in (("off", "on") if i % 2 == 0 else ("on", "off")):
                obs = start_observer(a.observer_args.split()) if mode == "on" else None
                data = f"{d}/{mode}.data"
                try:
                    rps = measure(url, a.seconds, data, a.close)
                finally:
                    # Never leave an observer running behind a failed measurement.
                    if obs:
                        stop(obs)
                runs[mode] = (rps, symbols(data))
            requests = {m: rps * a.seconds for m, (rps, _) in runs.items()}
            cpu = {m: sum(s.values()) / requests[m] for m, (_, s) in runs.items()}
            on, off = runs["on"][1], runs["off"][1]
            line = (f"pair {i + 1}: {runs['off'][0]:.0f} -> {runs['on'][0]:.0f} req/s "
                    f"(ratio {runs['on'][0] / runs['off'][0]:.3f}); CPU per request "
                    f"{cpu['off'] / 1e3:.1f} -> {cpu['on'] / 1e3:.1f} µs")
            direct = 0.0
            parts = []
            for name, pat in GROUPS:
                def group(samples, mode):
                    hit = (v for s, v in samples.items() if re.search(pat, s.split("] ", 1)[-1]))
                    return sum(hit) / requests[mode]
                # Less what the same symbols took without the observer (none, or
                # another BPF user's).
                ns = group(on, "on") - group(off, "off")
                direct += ns
                parts.append(f"{name} {ns:.0f}")
            print(line)
            print(f"  direct: {direct:.0f} ns per request = {100 * direct / cpu['off']:.1f}% of "
                  f"the baseline's CPU per request ({', '.join(parts)} ns); the ratio it "
                  f"alone allows on saturated CPUs: {cpu['off'] / (cpu['off'] + direct):.3f}")
            if a.top:
                grew = {s: on.get(s, 0) / requests["on"] - off.get(s, 0) / requests["off"]
                        for s in set(on) | set(off)}
                for s, ns in sorted(grew.items(), key=lambda kv: -kv[1])[:a.top]:
                    print(f"    {ns:8.0f} ns  {s}")
    finally:
        nginx.send_signal(signal.SIGQUIT)
        nginx.wait(timeout=10)
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
