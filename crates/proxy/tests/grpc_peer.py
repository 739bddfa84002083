#!/usr/bin/env python3
"""gRPC peers for the proxy's tests, from the `grpcio` package (not written here): a server and a
client using generic handlers over raw bytes, so no generated code is needed.

    grpc_peer.py server NAME PORT [ADDR] serves test.Echo on ADDR:PORT (h2c; ADDR 127.0.0.1)
    grpc_peer.py client ADDR CA HOST    runs every call through ADDR (TLS, CA, SNI HOST), prints JSON

Methods of test.Echo:
    Unary          answers "NAME:<request>"
    ServerStream   answers N messages "NAME:i" for a request "N"
    ClientStream   answers "NAME:<the requests joined by ,>"
    Bidi           answers each message "NAME:<message>"
    Slow           sleeps 2 s then answers (the client's deadline is shorter)
    Fail           aborts with NOT_FOUND, details, and trailing metadata
"""
import json, sys, time
from concurrent import futures

import grpc


def server(name, port, addr="127.0.0.1"):
    def unary(req, ctx):
        return f"{name}:".encode() + req

    def server_stream(req, ctx):
        for i in range(int(req)):
            yield f"{name}:{i}".encode()

    def client_stream(it, ctx):
        return f"{name}:".encode() + b",".join(it)

    def bidi(it, ctx):
        for m in it:
            yield f"{name}:".encode() + m

    def slow(req, ctx):
        time.sleep(2)
        return b"late"

    def fail(req, ctx):
        ctx.set_trailing_metadata((("x-why", "because"),))
        ctx.abort(grpc.StatusCode.NOT_FOUND, f"{name}: no such thing")

    h = grpc.method_handlers_generic_handler(
        "test.Echo",
        {
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "ServerStream": grpc.unary_stream_rpc_method_handler(server_stream),
            "ClientStream": grpc.stream_unary_rpc_method_handler(client_stream),
            "Bidi": grpc.stream_stream_rpc_method_handler(bidi),
            "Slow": grpc.unary_unary_rpc_method_handler(slow),
            "Fail": grpc.unary_unary_rpc_method_handler(fail),
        },
    )
    s = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    s.add_generic_rpc_handlers((h,))
    s.add_insecure_port(f"{addr}:{port}")
    s.start()
    print("ready", flush=True)
    s.wait_for_termination()


def client(addr, ca, host):
    creds = grpc.ssl_channel_credentials(root_certificates=open(ca, "rb").read())
    ch = grpc.secure_channel(addr, creds, options=(("grpc.ssl_target_name_override", host), ("grpc.default_authority", host)))
    grpc.channel_ready_future(ch).result(timeout=10)
    out = {}
    unary = ch.unary_unary("/test.Echo/Unary")
    names = {}
    for i in range(300):
        r = unary(f"m{i}".encode(), timeout=10).decode()
        n, body = r.split(":", 1)
        assert body == f"m{i}", r
        names[n] = names.get(n, 0) + 1
    out["unary_backends"] = names
    r = list(ch.unary_stream("/test.Echo/ServerStream")(b"5", timeout=10))
    out["server_stream"] = [x.decode() for x in r]
    r = ch.stream_unary("/test.Echo/ClientStream")(iter([b"a", b"b", b"c"]), timeout=10)
    out["client_stream"] = r.decode()
    r = ch.stream_stream("/test.Echo/Bidi")(iter([b"x", b"y", b"z", b"w"]), timeout=10)
    out["bidi"] = [x.decode() for x in r]
    t = time.time()
    try:
        ch.unary_unary("/test.Echo/Slow")(b"", timeout=0.5)
        out["deadline"] = "no error"
    except grpc.RpcError as e:
        out["deadline"] = e.code().name
        out["deadline_after_s"] = round(time.time() - t, 2)
    try:
        ch.unary_unary("/test.Echo/Fail")(b"", timeout=10)
        out["fail"] = "no error"
    except grpc.RpcError as e:
        out["fail"] = e.code().name
        out["fail_details"] = e.details()
        out["fail_trailers"] = dict(e.trailing_metadata() or ())
    try:
        ch.unary_unary("/test.Nope/Missing")(b"", timeout=10)
        out["unimplemented"] = "no error"
    except grpc.RpcError as e:
        out["unimplemented"] = e.code().name
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        server(sys.argv[2], int(sys.argv[3]), *sys.argv[4:5])
    else:
        client(sys.argv[2], sys.argv[3], sys.argv[4])
