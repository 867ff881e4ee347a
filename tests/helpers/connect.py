#!/usr/bin/env python3
"""connect.py HOST PORT: connects once (blocking, no timeout of its own) and
prints "OK <local port>" or "ERR <errno name> <local port or 0>"."""
import errno
import socket
import sys

host, port = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
try:
    s.connect((host, port))
    print("OK", s.getsockname()[1], flush=True)
except OSError as e:
    print("ERR", errno.errorcode.get(e.errno, str(e.errno)), s.getsockname()[1], flush=True)
