"""A multi-threaded process stopped (SIGSTOP, not traced) with a thread other
than its main one on its way out of mmap: where the observer's hold stops a
program that maps a library from a worker thread (rustc, a JVM), and where a
killed observer would leave it.

Usage: stopped_in_mmap.py SECONDS. Forks a child whose second thread maps
and unmaps a page in a loop while the main thread sleeps SECONDS; traces
that thread alone to the exit of one of its mmap calls, then detaches it
with SIGSTOP: the whole process is left in state T, the main thread in its
sleep, the worker in mmap. Prints the child's pid and exits. x86_64.
"""
import ctypes
import os
import signal
import sys
import threading
import time

PTRACE_GETREGS, PTRACE_ATTACH, PTRACE_DETACH, PTRACE_SYSCALL = 12, 16, 17, 24
WALL = 0x40000000
SYS_MMAP = 9
ENOSYS = 38
# struct user_regs_struct: rax is word 10, orig_rax word 15.
RAX, ORIG_RAX = 10, 15

libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
libc.ptrace.restype = ctypes.c_long


def ptrace(req, tid, data=None):
    if libc.ptrace(req, tid, None, data) != 0:
        sys.exit(f"ptrace({req}, {tid}): errno {ctypes.get_errno()}")


r, w = os.pipe()
pid = os.fork()
if pid == 0:
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    import mmap

    def churn():
        os.write(w, f"{threading.get_native_id()}\n".encode())
        while True:
            mmap.mmap(-1, 4096).close()

    threading.Thread(target=churn, daemon=True).start()
    time.sleep(float(sys.argv[1]))
    os._exit(0)

tid = int(os.read(r, 64).split()[0])
ptrace(PTRACE_ATTACH, tid)
os.waitpid(tid, WALL)
regs = (ctypes.c_ulonglong * 27)()
for _ in range(100000):
    ptrace(PTRACE_SYSCALL, tid)
    os.waitpid(tid, WALL)
    ptrace(PTRACE_GETREGS, tid, ctypes.addressof(regs))
    entering = ctypes.c_longlong(regs[RAX]).value == -ENOSYS
    if regs[ORIG_RAX] == SYS_MMAP and not entering:
        break
else:
    sys.exit("the worker made no mmap call")
ptrace(PTRACE_DETACH, tid, ctypes.c_void_p(signal.SIGSTOP))
print(pid, flush=True)
