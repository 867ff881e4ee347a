"""The client's own clock of the wire, for the SDK clients here: socket
reads and writes patched to note when each returned or left, as curl's -w
and Go's httptrace time them (what an SDK does after a read, parsing and
validating, is not the server's time)."""
import time

# perf_counter() of each socket write since the current call began.
SENT = []
# perf_counter() when the last socket read that returned bytes did.
LAST_READ = [None]


def noting_writes(write):
    def noted(self, *args, **kw):
        SENT.append(time.perf_counter())
        return write(self, *args, **kw)
    return noted


def noting_reads(read):
    def noted(self, *args, **kw):
        got = read(self, *args, **kw)
        if got:  # bytes, or a count of bytes read into a buffer
            LAST_READ[0] = time.perf_counter()
        return got
    return noted


def patch_reads(socket, ssl):
    """Every read of plain and TLS sockets notes when it returned bytes."""
    for cls, names in ((socket.socket, ("recv", "recv_into")), (ssl.SSLSocket, ("recv", "recv_into", "read"))):
        for name in names:
            setattr(cls, name, noting_reads(getattr(cls, name)))
