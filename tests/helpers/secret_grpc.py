"""gRPC with grpcio for tests/tests/secrets.rs: known secrets in metadata
and messages, both ways (cleartext h2, no generated code).

  secret_grpc.py server REPLY SET_COOKIE
      Serves observer.test.Secrets/Echo on 127.0.0.1; prints "PORT <port>".
      Each call's answer is REPLY, with SET_COOKIE in its initial metadata
      (set-cookie) and REPLY in its trailing metadata (x-reply-token).
  secret_grpc.py client PORT BEARER COOKIE API_KEY PROMPT REPLY
      One unary call whose message is PROMPT, with authorization, cookie
      and x-api-key metadata; prints its pid and whether REPLY came back.
"""

import json
import os
import sys
from concurrent import futures

import grpc

SERVICE = "observer.test.Secrets"


def same(b):
    return b


def serve(reply, set_cookie):
    def echo(request, context):
        context.send_initial_metadata((("set-cookie", "sid=" + set_cookie),))
        context.set_trailing_metadata((("x-reply-token", reply),))
        return reply.encode()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handlers = {"Echo": grpc.unary_unary_rpc_method_handler(echo, same, same)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"PORT {port}", flush=True)
    server.wait_for_termination()


def client(port, bearer, cookie, api_key, prompt, reply):
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        grpc.channel_ready_future(ch).result(timeout=10)
        call = ch.unary_unary(f"/{SERVICE}/Echo", same, same)
        answer = call(prompt.encode(), timeout=10, metadata=(
            ("authorization", "Bearer " + bearer),
            ("cookie", "session=" + cookie),
            ("x-api-key", api_key),
        ))
    print(json.dumps({"pid": os.getpid(), "answers": 1, "replied": answer == reply.encode()}),
          flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        serve(sys.argv[2], sys.argv[3])
    else:
        client(int(sys.argv[2]), *sys.argv[3:8])
