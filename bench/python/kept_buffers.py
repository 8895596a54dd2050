"""Buffers a program keeps: zeroed scratch, copies and repeated content,
with the standard library only (any Python 3.9+, no numpy), so any user can
run it.

  1. scratch buffers filled with data, then cleared to zeros and kept
  2. copies of a data buffer (bytes(x)), each with a few bytes changed
  3. a table of repeated 4 KiB records (the same page many times)

Seeded; prints the SHA-256 of everything it keeps, so
`pagefold run --compare` checks the output byte for byte. It holds its
memory for a few seconds (background scans run once a second). Plain it
peaks near 200 MB.
"""
import hashlib
import random
import time

MiB = 1 << 20
rng = random.Random(20261127)
kept = []

# 1. Scratch cleared to zeros: written pages that now hold only zeros.
for _ in range(4):
    scratch = bytearray(rng.randbytes(10 * MiB))
    scratch[:] = bytes(len(scratch))
    kept.append(scratch)

# 2. Copies of one data buffer, each changed in one place.
data = bytearray(rng.randbytes(16 * MiB))
for i in range(6):
    copy = bytearray(bytes(data))
    copy[i * 4096 : i * 4096 + 8] = b"changed!"
    kept.append(copy)

# 3. Repeated records: eight distinct 4 KiB pages, each 640 times.
records = [rng.randbytes(4096) for _ in range(8)]
table = bytearray(b"".join(records[i % 8] for i in range(5120)))
kept.append(table)

time.sleep(4)
total = hashlib.sha256()
for buf in kept:
    total.update(hashlib.sha256(buf).digest())
print(len(kept), "buffers,", sum(len(b) for b in kept) // MiB, "MiB, sha256", total.hexdigest()[:32])
