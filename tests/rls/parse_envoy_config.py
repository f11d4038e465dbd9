#!/usr/bin/env python3
"""Parse an Envoy bootstrap YAML into envoy's own Bootstrap message (PyPI xds-protos): every
field name, enum and typed_config must be one Envoy's API defines. Usage: parse_envoy_config.py FILE.
Exits 1, naming the problem, when the file is not a valid Bootstrap."""
import sys

import yaml
from google.protobuf.json_format import ParseDict, ParseError

from envoy.config.bootstrap.v3 import bootstrap_pb2
# The typed_config types the example names, registered in the descriptor pool.
from envoy.extensions.filters.http.ratelimit.v3 import rate_limit_pb2  # noqa: F401
from envoy.extensions.filters.http.router.v3 import router_pb2  # noqa: F401
from envoy.extensions.filters.network.http_connection_manager.v3 import (  # noqa: F401
    http_connection_manager_pb2,
)
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2  # noqa: F401


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    try:
        ParseDict(doc, bootstrap_pb2.Bootstrap())
    except ParseError as e:
        print(f"{sys.argv[1]}: {e}", file=sys.stderr)
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
