#!/usr/bin/env python3
"""Does this kernel load and attach a tp_btf program on sock_send_length, and
does bpf_sk_storage_get from it pass the verifier? Raw bpf(2) through ctypes,
as root; the programs do nothing and go when the script ends. See
bench/NOTES.md, "Keep-alive in 25 rounds": the candidate for fewer program
runs per request."""
import ctypes, struct, os, sys
libc = ctypes.CDLL(None, use_errno=True)
SYS_bpf = 321
def bpf(cmd, attr):
    buf = ctypes.create_string_buffer(attr, 256)
    r = libc.syscall(SYS_bpf, cmd, buf, 256)
    return r, ctypes.get_errno()

# --- find btf_trace_sock_send_length in vmlinux BTF
data = open('/sys/kernel/btf/vmlinux','rb').read()
magic, ver, flags, hdr_len, type_off, type_len, str_off, str_len = struct.unpack_from('<HBBIIIII', data, 0)
types = data[hdr_len+type_off: hdr_len+type_off+type_len]
strs = data[hdr_len+str_off: hdr_len+str_off+str_len]
def name(off): return strs[off:strs.index(b'\0', off)].decode()
pos=0; tid=0; want={}
while pos < len(types):
    tid += 1
    name_off, info, size = struct.unpack_from('<III', types, pos)
    kind = (info >> 24) & 0x1f; vlen = info & 0xffff
    pos += 12
    n = name(name_off)
    if n in ('btf_trace_sock_send_length',): want[n]=tid
    if kind == 1: pos += 4
    elif kind == 3: pos += 12
    elif kind in (4,5): pos += 12*vlen
    elif kind == 6: pos += 8*vlen
    elif kind == 13: pos += 8*vlen
    elif kind == 14: pos += 4
    elif kind == 15: pos += 12*vlen
    elif kind == 17: pos += 4
    elif kind == 19: pos += 12*vlen
print('btf ids', want)
tid = want['btf_trace_sock_send_length']

def insn(code, dst=0, src=0, off=0, imm=0):
    return struct.pack('<BBhi', code, (src<<4)|dst, off, imm)
EXIT = insn(0x95); MOV0 = insn(0xb7, 0, 0, 0, 0)
log = ctypes.create_string_buffer(1<<16)
lic = ctypes.create_string_buffer(b'GPL')
KEEP = []
# union bpf_attr for BPF_PROG_LOAD, at the uapi's offsets.
def prog_load(insns):
    prog = ctypes.create_string_buffer(insns)
    a = bytearray(256)
    struct.pack_into('<IIQQIIQII', a, 0, 26, len(insns)//8, ctypes.addressof(prog), ctypes.addressof(lic), 2, len(log), ctypes.addressof(log), 0, 0)
    a[48:64] = b'tpbtf_probe'.ljust(16, b'\0')
    struct.pack_into('<I', a, 64, 0)      # prog_ifindex
    struct.pack_into('<I', a, 68, 23)     # expected_attach_type BPF_TRACE_RAW_TP
    struct.pack_into('<I', a, 108, tid)   # attach_btf_id
    r, e = bpf(5, bytes(a)); 
    KEEP.append(prog)  # the kernel reads the buffer during the call only; keep it anyway
    return r, e
r, e = prog_load(MOV0 + EXIT)
print('tp_btf load:', r, os.strerror(e) if r < 0 else 'ok'); 
if r < 0: print(log.value.decode()[-2000:]); sys.exit(1)
pfd = r
# attach: BPF_RAW_TRACEPOINT_OPEN (17) with name NULL
a = bytearray(256); struct.pack_into('<QI', a, 0, 0, pfd)
r, e = bpf(17, bytes(a))
print('tp_btf attach:', r, os.strerror(e) if r < 0 else 'ok')
if r < 0: sys.exit(1)
os.close(r)
os.close(pfd)

# --- sk_storage map (needs BTF for key and value) and bpf_sk_storage_get from tp_btf
strs_b = b'\0int\0'
types_b = struct.pack('<III', 1, 1 << 24, 4) + struct.pack('<I', (1 << 24) | 32)
hdr = struct.pack('<HBBIIIII', 0xeB9F, 1, 0, 24, 0, len(types_b), len(types_b), len(strs_b))
blob = ctypes.create_string_buffer(hdr + types_b + strs_b)
blog = ctypes.create_string_buffer(4096)
a = bytearray(256); struct.pack_into('<QQIII', a, 0, ctypes.addressof(blob), ctypes.addressof(blog), len(hdr+types_b+strs_b), 4096, 1)
btf_fd, e = bpf(18, bytes(a))
print('btf load:', btf_fd, os.strerror(e) if btf_fd < 0 else 'ok')
if btf_fd < 0: print(blog.value.decode()); sys.exit(1)
a = bytearray(256)
struct.pack_into('<IIIII', a, 0, 24, 4, 4, 0, 1)
a[28:44] = b'probe_sk'.ljust(16, b'\0')
struct.pack_into('<III', a, 48, btf_fd, 1, 1)
mfd, e = bpf(0, bytes(a))
print('sk_storage map:', mfd, os.strerror(e) if mfd < 0 else 'ok')
if mfd < 0: sys.exit(1)
prog = (insn(0xbf, 6, 1) +                 # r6 = r1
        insn(0x79, 2, 6, 0) +              # r2 = *(u64 *)(r6 + 0): sk
        insn(0x18, 1, 1, 0, mfd) + insn(0) +  # r1 = map
        insn(0xb7, 3, 0, 0, 0) + insn(0xb7, 4, 0, 0, 0) +
        insn(0x85, 0, 0, 0, 107) +         # call bpf_sk_storage_get
        MOV0 + EXIT)
r, e = prog_load(prog)
print('tp_btf with bpf_sk_storage_get load:', r, os.strerror(e) if r < 0 else 'ok')
if r < 0: print(log.value.decode()[-3000:]); sys.exit(1)
a = bytearray(256); struct.pack_into('<QI', a, 0, 0, r)
l, e = bpf(17, bytes(a))
print('attach:', l, os.strerror(e) if l < 0 else 'ok')
sys.exit(1 if l < 0 else 0)
