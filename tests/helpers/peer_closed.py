"""A request sent on a connection the server had already closed.

  peer_closed.py
      A server thread answers one request (keep-alive, Content-Length) and
      closes the connection 50 ms later. The client sends "/first", reads the
      answer, waits 300 ms (the server's FIN arrives meanwhile), sends
      "/second" on the same socket and reads what comes (nothing, or a
      reset). Prints one JSON line: port (the server's), local_port (the
      client's), first_status, second ("eof" or "reset").
"""

import json
import socket
import threading
import time

srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
port = srv.getsockname()[1]


def serve():
    conn, _ = srv.accept()
    conn.recv(4096)
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    time.sleep(0.05)
    conn.close()


t = threading.Thread(target=serve)
t.start()
c = socket.create_connection(("127.0.0.1", port))
local_port = c.getsockname()[1]
c.sendall(b"GET /first HTTP/1.1\r\nHost: peer.test\r\n\r\n")
first = c.recv(4096)
t.join()
time.sleep(0.3)
c.sendall(b"GET /second HTTP/1.1\r\nHost: peer.test\r\n\r\n")
try:
    second = "eof" if c.recv(4096) == b"" else "data"
except ConnectionResetError:
    second = "reset"
c.close()
print(
    json.dumps(
        {
            "port": port,
            "local_port": local_port,
            "first_status": int(first.split()[1]),
            "second": second,
        }
    ),
    flush=True,
)
