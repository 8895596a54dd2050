"""A Python/numpy process holding a data set and the copies a typical
analysis leaves behind; prints its PID, then sleeps until killed.
Used by docs/ANALYSIS.md: `python3 numpy_workload.py [ROWS]`."""
import os
import sys
import time

import numpy as np

n = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000_000
rng = np.random.default_rng(1)
# The data set: a table of columns.
age = rng.integers(18, 90, n, dtype=np.int64)        # small integers in 8 bytes
income = rng.lognormal(10, 1, n)                     # random-looking doubles
member = rng.random(n) < 0.1                         # booleans
region = rng.integers(0, 10, n).astype(np.int32)     # low values
# What the analysis leaves in memory.
by_income = np.sort(income)                          # same values, new order
adjusted = income.copy()                             # a copy ...
adjusted[::4096] *= 1.01                             # ... with a few values changed
members_income = np.where(member, income, 0.0)       # mostly zero doubles
scratch = np.zeros(n)                                # calloc'd; written below
scratch[:] = 0.0
counts = np.bincount(region, minlength=10)
print(os.getpid(), flush=True)
time.sleep(3600)
