"""gRPC with grpcio, no generated code: raw bytes through generic handlers.

  grpc_pair.py server
      Serves observer.test.Echo on 127.0.0.1 (cleartext h2); prints
      "PORT <port>", then serves until killed:
        Unary         waits the request's first byte x 10 ms, answers 100 bytes
        Stream        waits 200 ms, then answers 5 messages 50 ms apart
        Fail          answers NOT_FOUND "no such thing: café" after 20 ms
  grpc_pair.py client PORT
      One channel (one HTTP/2 connection): Unary (30 ms), Stream, Fail, each
      timed by its own clock; prints one JSON object.
"""

import json
import sys
import time
from concurrent import futures

import grpc

SERVICE = "observer.test.Echo"


def same(b):
    return b


def unary(request, context):
    time.sleep(request[0] / 100)
    return b"u" * 100


def stream(request, context):
    time.sleep(0.2)
    for i in range(5):
        if i:
            time.sleep(0.05)
        yield bytes([i]) * 64


def fail(request, context):
    time.sleep(0.02)
    context.abort(grpc.StatusCode.NOT_FOUND, "no such thing: café")


def serve():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(unary, same, same),
        "Stream": grpc.unary_stream_rpc_method_handler(stream, same, same),
        "Fail": grpc.unary_unary_rpc_method_handler(fail, same, same),
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, handlers),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"PORT {port}", flush=True)
    server.wait_for_termination()


def client(port):
    out = {}
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        grpc.channel_ready_future(ch).result(timeout=10)
        call = ch.unary_unary(f"/{SERVICE}/Unary", same, same)
        t0 = time.monotonic_ns()
        reply = call(bytes([3]) + b"x" * 20, timeout=10)
        out["unary"] = {"ns": time.monotonic_ns() - t0, "bytes": len(reply)}

        call = ch.unary_stream(f"/{SERVICE}/Stream", same, same)
        t0 = time.monotonic_ns()
        first, n = None, 0
        for _ in call(b"s", timeout=10):
            n += 1
            if first is None:
                first = time.monotonic_ns() - t0
        out["stream"] = {"ns": time.monotonic_ns() - t0, "first_ns": first, "messages": n}

        call = ch.unary_unary(f"/{SERVICE}/Fail", same, same)
        t0 = time.monotonic_ns()
        try:
            call(b"f", timeout=10)
            code = "OK"
        except grpc.RpcError as e:
            code = e.code().name
        out["fail"] = {"ns": time.monotonic_ns() - t0, "code": code}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        serve()
    else:
        client(int(sys.argv[2]))
