"""Notebook cells on a 1.5M-row frame: deep copies, a group-by, a sort, a merge.

A notebook keeps every cell's result: here six deep copies of one frame
(`df.copy()`, as defensive code and "what if" cells make them), each with a
column or two changed, then a group-by, a sort and a merge with a small
table. Most of each copy is never written again: what sharing could save is
the pages the copies did not change.

Seeded; prints exact aggregates and a SHA-256 of every kept frame, so
`pagefold run --compare` checks the output is byte-identical to plain.
"""
import hashlib

import numpy as np
import pandas as pd

ROWS = 1_500_000
rng = np.random.default_rng(3)


def digest(frame):
    rows = pd.util.hash_pandas_object(frame, index=True).to_numpy()
    return hashlib.sha256(rows.tobytes()).hexdigest()[:16]


df = pd.DataFrame({f"x{i}": rng.normal(size=ROWS) for i in range(12)})
df["key"] = rng.integers(0, 5000, ROWS)
df["day"] = rng.integers(0, 365, ROWS).astype(np.int16)
print("base", digest(df))

copies = []
for k in range(6):
    c = df.copy()
    c[f"x{k}"] = c[f"x{k}"] * (1.0 + 0.01 * k)
    if k % 2:
        c["flag"] = c["x0"] > k * 0.1
    copies.append(c)
    print("copy", k, digest(c))

by_key = copies[2].groupby("key", sort=True).agg(m=("x1", "mean"), s=("x2", "sum"), n=("x3", "count"))
print("groupby", digest(by_key.round(8)))
ranked = copies[3].sort_values(["day", "x4"], kind="stable")
print("sort", digest(ranked))
table = pd.DataFrame({"key": np.arange(5000), "weight": rng.uniform(0, 1, 5000)})
merged = copies[4].merge(table, on="key", how="left")
print("merge", round(float((merged["weight"] * merged["x5"]).sum()), 6), digest(merged))
print("kept", len(copies) + 4, "frames")
