"""A process stopped (SIGSTOP, not traced) on its way out of execve: where the
observer's exec hold stops one, and where a killed observer would leave it.

Usage: stopped_at_exec.py SECONDS. Forks a child that asks to be traced and
execs `sleep SECONDS` (the kernel stops a traced child at its exec), then
detaches it with SIGSTOP: the child is left in state T inside execve. Prints
the child's pid and exits (the child is reparented).
"""
import ctypes
import os
import signal
import sys

PTRACE_TRACEME, PTRACE_DETACH = 0, 17
libc = ctypes.CDLL(None, use_errno=True)
pid = os.fork()
if pid == 0:
    # Not the caller's pipes: it reads ours to their end.
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    libc.ptrace(PTRACE_TRACEME, 0, None, None)
    os.execv("/bin/sleep", ["sleep", sys.argv[1]])
_, status = os.waitpid(pid, os.WUNTRACED)
assert os.WIFSTOPPED(status) and os.WSTOPSIG(status) == signal.SIGTRAP, status
if libc.ptrace(PTRACE_DETACH, pid, None, ctypes.c_void_p(signal.SIGSTOP)) != 0:
    sys.exit(f"PTRACE_DETACH: errno {ctypes.get_errno()}")
print(pid, flush=True)
