"""Notebook-style pandas data work on a few million rows.

A sales table (4M rows) and a store table are loaded, cleaned, joined,
grouped and pivoted the way an analysis notebook does it: every cell keeps
its result in a variable (df, df2, joined, by_store, pivot, ...), pandas
makes its own defensive copies (`assign`, `fillna`, `merge`, `sort_values`,
`copy`), and a few columns are derived from others. Nothing here is written
for pagefold.

Seeded; prints exact aggregates and a SHA-256 of every kept result, so
`pagefold run --compare` checks the output is byte-identical to plain.
"""
import hashlib

import numpy as np
import pandas as pd

ROWS = 4_000_000
rng = np.random.default_rng(11)


def digest(obj):
    """SHA-256 of pandas' own per-row hashes, index included."""
    rows = pd.util.hash_pandas_object(obj, index=True).to_numpy()
    return hashlib.sha256(rows.tobytes()).hexdigest()[:16]


sales = pd.DataFrame({
    "store": rng.integers(0, 800, ROWS, dtype=np.int32),
    "product": rng.integers(0, 5000, ROWS, dtype=np.int32),
    "day": rng.integers(0, 730, ROWS, dtype=np.int16),
    "qty": rng.integers(1, 12, ROWS, dtype=np.int64),
    "price": np.round(rng.lognormal(2.5, 0.7, ROWS), 2),
    "discount": np.where(rng.random(ROWS) < 0.05, np.nan, np.round(rng.random(ROWS) * 0.3, 3)),
})
stores = pd.DataFrame({
    "store": np.arange(800, dtype=np.int32),
    "region": rng.integers(0, 12, 800, dtype=np.int8),
    "size_m2": rng.integers(200, 5000, 800),
})
print("loaded", len(sales), digest(sales))

# Cleaning: defensive copies, as notebooks make them.
clean = sales.fillna({"discount": 0.0})
clean = clean.assign(revenue=clean["qty"] * clean["price"] * (1.0 - clean["discount"]))
clean = clean[clean["qty"] > 0].copy()
print("clean", round(float(clean["revenue"].sum()), 2), digest(clean))

# Join with the store table.
joined = clean.merge(stores, on="store", how="left")
print("joined", joined.shape, digest(joined[["region", "size_m2", "revenue"]]))

# Group-bys at several grains.
by_store = joined.groupby("store", sort=True)["revenue"].agg(["sum", "mean", "count"])
by_region_day = joined.groupby(["region", "day"], sort=True)["qty"].sum()
by_product = joined.groupby("product", sort=True).agg(qty=("qty", "sum"), revenue=("revenue", "sum"))
print("by_store", digest(by_store.round(6)))
print("by_region_day", int(by_region_day.sum()), digest(by_region_day))
print("by_product", digest(by_product.round(6)))

# A pivot table and a sorted copy kept for a chart.
pivot = joined.pivot_table(index="region", columns=joined["day"] // 30, values="revenue",
                           aggfunc="sum", fill_value=0.0)
print("pivot", pivot.shape, digest(pivot.round(6)))
ranked = joined.sort_values(["region", "revenue"], ascending=[True, False], kind="stable")
top = ranked.groupby("region", sort=True).head(5)
print("top", digest(top[["store", "product", "revenue"]]))

# Derived columns on copies of the joined frame ("what if" cells).
what_if = joined.copy()
what_if["price"] = what_if["price"] * 1.05
what_if["revenue"] = what_if["qty"] * what_if["price"] * (1.0 - what_if["discount"])
delta = (what_if["revenue"].sum() - joined["revenue"].sum())
print("what_if", round(float(delta), 2), digest(what_if[["revenue"]]))

# A rolling mean per store over days.
daily = joined.groupby(["store", "day"], sort=True)["revenue"].sum().reset_index()
daily["rolling"] = daily.groupby("store")["revenue"].transform(lambda s: s.rolling(7, min_periods=1).mean())
print("rolling", digest(daily.round(6)))
kept = [sales, clean, joined, by_store, by_region_day, by_product, pivot, ranked, top, what_if, daily]
print("kept", len(kept), "frames")
