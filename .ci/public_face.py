#!/usr/bin/env python3
"""The crate's public face, read from the API docs `cargo doc --no-deps` just wrote.

Every item an embedder can name has a page. The supported API is what the crate root
re-exports (pages beside `target/doc/fleet_limiter/index.html`); anything else public lives in
a public module (`calibration`, the binary's offline commands). Prints both counts and exits 1
when the items outside the root's API exceed the limit (default 250) or a module other than
`calibration` is public.
"""
import os
import sys

LIMIT = int(sys.argv[1]) if len(sys.argv) > 1 else 250
ROOT = os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "doc", "fleet_limiter")
PUBLIC_MODULES = {"calibration"}


def is_item(path):
    name = os.path.basename(path)
    if not name.endswith(".html") or name in ("index.html", "all.html"):
        return False
    if name.startswith("sidebar-items"):
        return False
    with open(path, encoding="utf-8", errors="replace") as f:
        head = f.read(600)
    # Rustdoc leaves redirect pages where an item used to be named; they are not items.
    return 'http-equiv="refresh"' not in head


root_items, outside, modules = [], [], set()
for dirpath, _dirs, files in os.walk(ROOT):
    rel = os.path.relpath(dirpath, ROOT)
    for f in files:
        p = os.path.join(dirpath, f)
        if f == "index.html" and rel != ".":
            with open(p, encoding="utf-8", errors="replace") as fh:
                if 'http-equiv="refresh"' not in fh.read(600):
                    modules.add(rel)
            continue
        if not is_item(p):
            continue
        (root_items if rel == "." else outside).append(os.path.join(rel, f))

print(f"re-exported at the crate root: {len(root_items)} items")
print(f"public modules: {', '.join(sorted(modules)) or 'none'}")
print(f"items outside the root's API: {len(outside)} (limit {LIMIT})")
bad = sorted(m for m in modules if m.split(os.sep)[0] not in PUBLIC_MODULES)
if bad:
    print("modules that should not be public: " + ", ".join(bad))
if len(outside) > LIMIT or bad or not root_items:
    sys.exit(1)
