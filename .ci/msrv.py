#!/usr/bin/env python3
"""The declared rust-version holds: no dependency that goes into the build (dev-dependencies
aside) asks for a newer Rust, and the toolchain at hand is not older. Clippy's
`incompatible_msrv` lint (run by .ci/run with -D warnings) holds our own code to the same
version: it refuses any standard-library item stabilised after it."""
import json
import re
import subprocess
import sys


def version(v):
    return tuple(int(x) for x in (v.split(".") + ["0", "0"])[:3])


meta = json.loads(
    subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
)
packages = {p["id"]: p for p in meta["packages"]}
root = meta["resolve"]["root"]
declared = packages[root].get("rust_version")
if not declared:
    sys.exit("Cargo.toml: package.rust-version is missing; declare the oldest Rust that builds the crate")
nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}

# Everything reachable from the crate through normal and build dependencies.
seen, todo = set(), [root]
while todo:
    node = nodes[todo.pop()]
    for dep in node["deps"]:
        if any(k["kind"] in (None, "build") for k in dep["dep_kinds"]) and dep["pkg"] not in seen:
            seen.add(dep["pkg"])
            todo.append(dep["pkg"])

newer = sorted(
    (packages[p]["name"], packages[p]["version"], packages[p]["rust_version"])
    for p in seen
    if packages[p].get("rust_version") and version(packages[p]["rust_version"]) > version(declared)
)
if newer:
    for name, v, rv in newer:
        print(f"Cargo.toml: rust-version = {declared}, but {name} {v} needs Rust {rv}", file=sys.stderr)
    sys.exit("raise package.rust-version, or hold those dependencies back in Cargo.lock")

rustc = subprocess.run(["rustc", "--version"], check=True, capture_output=True, text=True).stdout
have = re.search(r"rustc (\d+\.\d+\.\d+)", rustc).group(1)
if version(have) < version(declared):
    sys.exit(f"this toolchain is Rust {have}, older than the declared rust-version {declared}")
top = max(
    (packages[p]["rust_version"] for p in seen if packages[p].get("rust_version")),
    key=version,
    default="(none declared)",
)
print(f"rust-version {declared}: {len(seen)} build dependencies ask for at most {top}; toolchain {have}")
