#!/usr/bin/env python3
"""Kernel facts the "no per-call socket hooks" redesign would lean on (see
bench/NOTES.md, "Where a keep-alive request's cost goes"), checked on this
kernel with raw bpf(2) through ctypes, as root. Everything is attached through
bpf links, so nothing stays behind when the script ends.

1. A cgroup_skb egress program may call bpf_get_current_pid_tgid (kernel
   6.10+), and for a client's own sends it names the sending process: the
   owner of a connection could come from its first payload packet instead of
   from sock_send_length / sock_recv_length.
2. A sock_ops program loads and attaches on the root cgroup, sees a new
   connection's callbacks, and may call bpf_sock_ops_cb_flags_set (the
   per-socket switch that lets a settled socket cost nothing more).
"""
import ctypes
import os
import socket
import struct
import sys

libc = ctypes.CDLL(None, use_errno=True)
SYS_BPF = 321
BPF_MAP_CREATE, BPF_MAP_LOOKUP_ELEM, BPF_PROG_LOAD, BPF_LINK_CREATE = 0, 1, 5, 28
PROG_CGROUP_SKB, PROG_SOCK_OPS = 8, 13
ATTACH_CGROUP_INET_EGRESS, ATTACH_CGROUP_SOCK_OPS = 1, 3
MAP_ARRAY = 2
HELPER_MAP_LOOKUP, HELPER_PID_TGID, HELPER_CB_FLAGS_SET = 1, 14, 59
SKB_LOCAL_PORT = 136  # offsetof(struct __sk_buff, local_port), host order
OPS_LOCAL_PORT = 68  # offsetof(struct bpf_sock_ops, local_port), host order
KEEP = []


def bpf(cmd, attr):
    buf = ctypes.create_string_buffer(bytes(attr), 256)
    r = libc.syscall(SYS_BPF, cmd, buf, 256)
    return r, ctypes.get_errno()


def fail(what, e, log=None):
    print(f"{what}: {os.strerror(e)}")
    if log:
        print(log[-3000:])
    sys.exit(1)


class Asm:
    """Enough of an assembler for a few jumps to labels."""

    def __init__(self):
        self.code = []  # (opcode, dst, src, off or label, imm)

    def i(self, op, dst=0, src=0, off=0, imm=0):
        self.code.append([op, dst, src, off, imm])

    def ld_map(self, dst, fd):
        self.i(0x18, dst, 1, 0, fd)  # ld_imm64 with BPF_PSEUDO_MAP_FD
        self.i(0, 0, 0, 0, 0)

    def label(self, name):
        self.code.append(name)

    def bytes(self):
        pos, labels, n = {}, {}, 0
        for c in self.code:
            if isinstance(c, str):
                labels[c] = n
            else:
                pos[id(c)] = n
                n += 1
        out = b""
        for c in self.code:
            if isinstance(c, str):
                continue
            op, dst, src, off, imm = c
            if isinstance(off, str):
                off = labels[off] - pos[id(c)] - 1
            out += struct.pack("<BBhi", op, (src << 4) | dst, off, imm)
        return out


def map_create():
    a = bytearray(256)
    struct.pack_into("<IIII", a, 0, MAP_ARRAY, 4, 8, 4)
    fd, e = bpf(BPF_MAP_CREATE, a)
    if fd < 0:
        fail("array map", e)
    return fd


def map_get(fd, key):
    k, v = ctypes.c_uint32(key), ctypes.c_uint64(0)
    a = bytearray(256)
    struct.pack_into("<IIQQ", a, 0, fd, 0, ctypes.addressof(k), ctypes.addressof(v))
    r, e = bpf(BPF_MAP_LOOKUP_ELEM, a)
    if r < 0:
        fail("map lookup", e)
    return v.value


def bump(asm, mfd, slot, out):
    """map[slot] += 1 (atomic)."""
    asm.i(0x62, 10, 0, -4, slot)  # *(u32 *)(r10 - 4) = slot
    asm.i(0xBF, 2, 10)  # r2 = r10
    asm.i(0x07, 2, 0, 0, -4)  # r2 += -4
    asm.ld_map(1, mfd)
    asm.i(0x85, 0, 0, 0, HELPER_MAP_LOOKUP)
    asm.i(0x15, 0, 0, out, 0)  # if r0 == 0 goto out
    asm.i(0xB7, 1, 0, 0, 1)  # r1 = 1
    asm.i(0xDB, 0, 1, 0, 0)  # lock *(u64 *)(r0 + 0) += r1


def prog_load(ptype, code, eat, name):
    lic = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(1 << 16)
    prog = ctypes.create_string_buffer(code)
    KEEP.extend([lic, log, prog])
    a = bytearray(256)
    struct.pack_into("<IIQQIIQ", a, 0, ptype, len(code) // 8, ctypes.addressof(prog),
                     ctypes.addressof(lic), 1, len(log), ctypes.addressof(log))
    a[48:64] = name.encode().ljust(16, b"\0")[:16]
    struct.pack_into("<I", a, 68, eat)  # expected_attach_type
    fd, e = bpf(BPF_PROG_LOAD, a)
    if fd < 0:
        fail(f"{name} load", e, log.value.decode(errors="replace"))
    return fd


def link_cgroup(prog, cg, attach_type, what):
    a = bytearray(256)
    struct.pack_into("<IIII", a, 0, prog, cg, attach_type, 0)
    fd, e = bpf(BPF_LINK_CREATE, a)
    if fd < 0:
        fail(f"{what} attach", e)
    return fd


def cgroup_root():
    for line in open("/proc/self/mounts"):
        f = line.split()
        if f[2] == "cgroup2":
            return f[1]
    sys.exit("no cgroup2 mount")


def main():
    if os.geteuid() != 0:
        sys.exit("run as root")
    cg = os.open(cgroup_root(), os.O_RDONLY)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(10)
    # The client's port is chosen here (any free one), so the programs can
    # pick its packets out; the client is a child that waits until they are in.
    client = socket.socket()
    client.bind(("127.0.0.1", 0))
    port = client.getsockname()[1]
    go_r, go_w = os.pipe()
    child = os.fork()
    if child == 0:
        status = 1
        try:
            os.close(go_w)
            # Nothing to read: the parent gave up before the programs were in.
            if os.read(go_r, 1):
                client.connect(server.getsockname())
                client.sendall(b"x" * 100)
                client.close()
                status = 0
        finally:
            os._exit(status)
    client.close()
    os.close(go_r)

    # 1. cgroup_skb egress: packets from the client's port; slot 0 counts them,
    # slot 1 those sent with the child as the current process.
    skb_map = map_create()
    asm = Asm()
    asm.i(0xBF, 6, 1)  # r6 = ctx
    asm.i(0x61, 2, 6, SKB_LOCAL_PORT)  # r2 = skb->local_port
    asm.i(0x55, 2, 0, "out", port)  # if r2 != port goto out
    asm.i(0x85, 0, 0, 0, HELPER_PID_TGID)
    asm.i(0xBF, 7, 0)  # r7 = pid_tgid
    asm.i(0x77, 7, 0, 0, 32)  # r7 >>= 32: tgid
    bump(asm, skb_map, 0, "out")
    asm.i(0x55, 7, 0, "out", child)  # if tgid != child goto out
    bump(asm, skb_map, 1, "out")
    asm.label("out")
    asm.i(0xB7, 0, 0, 0, 1)  # r0 = 1: let the packet through
    asm.i(0x95)
    skb = prog_load(PROG_CGROUP_SKB, asm.bytes(), ATTACH_CGROUP_INET_EGRESS, "chk_skb_pid")
    print("cgroup_skb egress calling bpf_get_current_pid_tgid: loads")
    link_cgroup(skb, cg, ATTACH_CGROUP_INET_EGRESS, "cgroup_skb egress")

    # 2. sock_ops: count callbacks of the client's socket and call
    # bpf_sock_ops_cb_flags_set(ctx, 0) from them.
    ops_map = map_create()
    asm = Asm()
    asm.i(0xBF, 6, 1)  # r6 = ctx
    asm.i(0x61, 2, 6, OPS_LOCAL_PORT)  # r2 = skops->local_port
    asm.i(0x55, 2, 0, "out", port)
    bump(asm, ops_map, 0, "out")
    asm.i(0xBF, 1, 6)
    asm.i(0xB7, 2, 0, 0, 0)
    asm.i(0x85, 0, 0, 0, HELPER_CB_FLAGS_SET)
    asm.label("out")
    asm.i(0xB7, 0, 0, 0, 1)
    asm.i(0x95)
    ops = prog_load(PROG_SOCK_OPS, asm.bytes(), ATTACH_CGROUP_SOCK_OPS, "chk_sockops")
    print("sock_ops calling bpf_sock_ops_cb_flags_set: loads")
    link_cgroup(ops, cg, ATTACH_CGROUP_SOCK_OPS, "sock_ops")

    os.write(go_w, b"g")
    try:
        conn, _ = server.accept()
    except socket.timeout:
        sys.exit("the client never connected")
    got = b""
    while len(got) < 100:
        d = conn.recv(4096)
        if not d:
            break
        got += d
    _, status = os.waitpid(child, 0)
    conn.close()
    if status != 0 or len(got) != 100:
        sys.exit(f"the client failed (status {status}, {len(got)} of 100 bytes arrived)")

    packets, own = map_get(skb_map, 0), map_get(skb_map, 1)
    callbacks = map_get(ops_map, 0)
    print(f"client {child}: {packets} egress packets from port {port}, {own} of them "
          f"with the client as the current process")
    print(f"sock_ops callbacks for the client's socket: {callbacks}")
    ok = packets > 0 and own > 0 and callbacks > 0
    print("ok" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
