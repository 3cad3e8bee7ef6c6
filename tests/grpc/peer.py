"""A gRPC peer that is not snag, built on grpcio (the reference C-core stack).

  peer.py serve                 a server: grpc.health.v1 (SERVING) and /snag.test.Echo/Say
                                (answers the request's bytes); prints its port, runs
                                until stdin closes
  peer.py health TARGET [CA]    a health check; prints {"status": ...} or {"code": ...}
  peer.py say TARGET TEXT [CA]  a unary call; prints {"reply": ...} or {"code": ...}
  peer.py call TARGET METHOD TEXT [CA]
                                the same to any method, e.g. /snag.Backend/Echo

With CA (a PEM file) the client speaks TLS, checking the certificate for localhost.
"""

import json
import sys

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc


def identity(b):
    return b


def serve():
    server = grpc.server(__import__("concurrent.futures").futures.ThreadPoolExecutor(4))
    checker = health.HealthServicer()
    checker.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    say = grpc.unary_unary_rpc_method_handler(
        lambda request, context: b"echo:" + request,
        request_deserializer=identity,
        response_serializer=identity,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("snag.test.Echo", {"Say": say}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    sys.stdin.read()
    server.stop(0)


def channel(target, ca):
    if ca is None:
        return grpc.insecure_channel(target)
    with open(ca, "rb") as f:
        creds = grpc.ssl_channel_credentials(root_certificates=f.read())
    return grpc.secure_channel(target, creds)


def report(call):
    try:
        print(json.dumps(call()))
    except grpc.RpcError as e:
        print(json.dumps({"code": e.code().name, "details": e.details()}))


def main():
    kind = sys.argv[1]
    if kind == "serve":
        return serve()
    target = sys.argv[2]
    if kind == "health":
        ca = sys.argv[3] if len(sys.argv) > 3 else None
        stub = health_pb2_grpc.HealthStub(channel(target, ca))
        report(lambda: {
            "status": health_pb2.HealthCheckResponse.ServingStatus.Name(
                stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status
            )
        })
    elif kind in ("say", "call"):
        args = sys.argv[3:] if kind == "call" else ["/snag.test.Echo/Say"] + sys.argv[3:]
        method, text = args[0], args[1]
        ca = args[2] if len(args) > 2 else None
        say = channel(target, ca).unary_unary(
            method,
            request_serializer=identity,
            response_deserializer=identity,
        )
        report(lambda: {"reply": say(text.encode(), timeout=5).decode()})


if __name__ == "__main__":
    main()
