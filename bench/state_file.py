#!/usr/bin/env python3
"""Write a store.state_file of N GCRA buckets (see src/store/state_file.rs for the format).

Usage: state_file.py PATH N. Each bucket is 10 minutes from full; no known agents.
"""
import hashlib
import os
import struct
import sys
import time

path, n = sys.argv[1], int(sys.argv[2])
body = bytearray(b"FLSTATE\0")
body += struct.pack("<IQQQQ", 1, 0x1234, 0x5678, time.time_ns(), n)
left = 600 * 1_000_000_000
for i in range(n):
    digest = hashlib.blake2b(i.to_bytes(8, "little"), digest_size=16).digest()
    body += digest + struct.pack("<BQI", 0, left, 0)
body += struct.pack("<QQQ", 0x9abc, 0xdef0, 0)
body += hashlib.sha256(body).digest()
with open(path, "wb") as f:
    f.write(body)
os.chmod(path, 0o600)
