#!/usr/bin/env python3
"""Ask a RateLimitService with envoy's own generated client (PyPI xds-protos + grpcio).

Usage: client.py HOST:PORT < requests.json

stdin: a JSON list of RateLimitRequest messages in protobuf's JSON mapping
(`{"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}], "hits_addend": 2}`).
An item {"raw_hex": "<bytes>"} is sent as those bytes, undecoded: a message that is not one.
stdout: a JSON list, one item per request: {"ok": <RateLimitResponse as JSON, field names as in
the .proto, defaults included>} or {"error": "<grpc status code name>", "detail": "..."}.
"""
import json
import sys

import grpc
from google.protobuf.json_format import MessageToDict, ParseDict

from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc


def as_dict(msg):
    try:
        return MessageToDict(msg, preserving_proto_field_name=True,
                             always_print_fields_with_no_presence=True)
    except TypeError:  # protobuf < 5.26
        return MessageToDict(msg, preserving_proto_field_name=True,
                             including_default_value_fields=True)


def main():
    addr = sys.argv[1]
    requests = json.load(sys.stdin)
    options = [("grpc.max_send_message_length", 64 << 20),
               ("grpc.max_receive_message_length", 64 << 20)]
    with grpc.insecure_channel(addr, options=options) as channel:
        grpc.channel_ready_future(channel).result(timeout=30)
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        raw = channel.unary_unary(
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            request_serializer=None,
            response_deserializer=None,
        )
        out = []
        for r in requests:
            try:
                if "raw_hex" in r:
                    raw(bytes.fromhex(r["raw_hex"]), timeout=30)
                    out.append({"ok": "raw"})
                    continue
                msg = ParseDict(r, rls_pb2.RateLimitRequest())
                out.append({"ok": as_dict(stub.ShouldRateLimit(msg, timeout=30))})
            except grpc.RpcError as e:
                out.append({"error": e.code().name, "detail": e.details()})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
