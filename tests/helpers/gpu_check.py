#!/usr/bin/env python3
"""GPU check on a machine with a real NVIDIA GPU (`cargo xtask gpu-check`).

Holds a CUDA context on device 0 (the CUDA driver API through ctypes: no
toolkit needed) with 512 MiB allocated, and serves one TCP request; then
compares `observer gpu --json` with `nvidia-smi --query-gpu` and, as root,
checks that a short `observer watch` gives this process's inbound record the
device. Prints a report; exits 1 on a mismatch.
"""
import ctypes
import json
import os
import socket
import subprocess
import sys
import threading
import time

OBS = sys.argv[1] if len(sys.argv) > 1 else "target/release/observer"
failures = []


def check(what, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + what + (f": {detail}" if detail else ""), flush=True)
    if not ok:
        failures.append(what)


def cuda_context(mib):
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0, "cuInit"
    dev = ctypes.c_int()
    assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0, "cuDeviceGet"
    ctx = ctypes.c_void_p()
    assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0, "cuCtxCreate"
    ptr = ctypes.c_uint64()
    assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), mib << 20) == 0, "cuMemAlloc"
    return cuda, ctx, ptr


def smi():
    q = "index,uuid,name,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw"
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True,
    ).stdout
    rows = []
    for line in out.strip().splitlines():
        f = [x.strip() for x in line.split(",")]
        rows.append({"index": int(f[0]), "uuid": f[1], "name": f[2], "util": float(f[3]),
                     "mem_used_mib": float(f[4]), "mem_total_mib": float(f[5]),
                     "temp": float(f[6]), "power_w": float(f[7]) if f[7] not in ("[N/A]", "N/A") else None})
    return rows


def main():
    try:
        keep = cuda_context(512)
    except Exception as e:  # no CUDA driver: say so, the rest still runs
        keep = None
        print(f"note: no CUDA context ({e})", flush=True)
    me = os.getpid()
    out = subprocess.run([OBS, "gpu", "--json"], capture_output=True, text=True)
    check("observer gpu --json exits 0", out.returncode == 0, out.stderr.strip())
    if out.returncode != 0:
        return
    ours = json.loads(out.stdout)
    theirs = smi()
    print("observer:", json.dumps(ours)[:2000], flush=True)
    print("nvidia-smi:", json.dumps(theirs), flush=True)
    check("same device count", len(ours) == len(theirs), f"{len(ours)} vs {len(theirs)}")
    for o, t in zip(ours, theirs):
        i = t["index"]
        check(f"GPU {i} uuid", o["uuid"] == t["uuid"], f"{o['uuid']} vs {t['uuid']}")
        check(f"GPU {i} name", o["name"] == t["name"], f"{o['name']} vs {t['name']}")
        check(f"GPU {i} memory total", abs(o["memory_total_bytes"] / 2**20 - t["mem_total_mib"]) <= 1,
              f"{o['memory_total_bytes'] / 2**20:.0f} vs {t['mem_total_mib']:.0f} MiB")
        check(f"GPU {i} memory used (within 64 MiB)", abs(o["memory_used_bytes"] / 2**20 - t["mem_used_mib"]) <= 64,
              f"{o['memory_used_bytes'] / 2**20:.0f} vs {t['mem_used_mib']:.0f} MiB")
        check(f"GPU {i} utilization (within 10 points)", abs(o["utilization_gpu_pct"] - t["util"]) <= 10,
              f"{o['utilization_gpu_pct']} vs {t['util']}")
        check(f"GPU {i} temperature (within 3 C)", abs(o["temperature_c"] - t["temp"]) <= 3,
              f"{o['temperature_c']} vs {t['temp']}")
        if t["power_w"] is not None and o["power_w"] is not None:
            check(f"GPU {i} power (within 20%)", abs(o["power_w"] - t["power_w"]) <= 0.2 * t["power_w"] + 5,
                  f"{o['power_w']:.0f} vs {t['power_w']:.0f} W")
    if keep is not None:
        procs = ours[0]["processes"]
        mine = [p for p in procs if p["pid"] == me]
        check("this process's context on GPU 0", bool(mine), json.dumps(procs))
        if mine and mine[0]["used_memory_bytes"] is not None:
            check("its memory >= 512 MiB", mine[0]["used_memory_bytes"] >= 512 << 20, str(mine[0]["used_memory_bytes"]))
    if os.geteuid() != 0 or keep is None:
        print("note: watch check skipped (needs root and a CUDA context)", flush=True)
        return
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]

    def serve():
        c, _ = srv.accept()
        c.recv(100)
        time.sleep(0.3)
        c.sendall(b"x" * 100)
        c.close()

    threading.Thread(target=serve, daemon=True).start()
    w = subprocess.Popen([OBS, "watch", "--json", "--duration", "5", "--port", str(port), "--gpu-interval", "100"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in w.stderr:
        if line.startswith("ready"):
            print("watch:", line.strip(), flush=True)
            break
    time.sleep(0.5)
    c = socket.create_connection(("127.0.0.1", port))
    c.sendall(b"request")
    c.recv(1000)
    c.close()
    out, _ = w.communicate(timeout=30)
    recs = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    inbound = [r for r in recs if r["direction"] == "inbound" and r["pid"] == me]
    check("watch: this process's inbound record", bool(inbound), out[:500])
    if inbound:
        g = inbound[0]["gpu"]
        print("gpu:", json.dumps(g), flush=True)
        check("watch: its record carries GPU 0", bool(g) and g["devices"][0]["uuid"] == theirs[0]["uuid"], json.dumps(g))


main()
print("gpu-check:", "FAILED " + ", ".join(failures) if failures else "all checks passed", flush=True)
sys.exit(1 if failures else 0)
