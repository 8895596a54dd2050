"""Copies of large numpy arrays, as numerical code makes them.

Seeded; prints a deterministic summary (SHA-256 of every kept array and a few
exact reductions), so `pagefold run --compare` can check it byte for byte.

  1. an iterative solver (damped block-Jacobi on a banded system) that keeps
     `x_prev = x.copy()` and a history of iterates, updating one block of
     unknowns per sweep (the rest of the vector is unchanged)
  2. "what if" variants of a data set: np.copy, then a slice of it modified
  3. slicing + copy (halves and strided windows), astype(same dtype)
     (numpy copies), np.array(x) (copies), np.concatenate of a set of blocks
  4. a 2-D field: copies with rows modified (few pages touched) and with a
     column modified (every page touched)

Plain it takes about 10 s and peaks near 1.5 GB.
"""
import hashlib
import sys

import numpy as np

N = 8_000_000            # 64 MB of float64 per vector
ROWS, COLS = 3000, 3000  # 72 MB matrix
rng = np.random.default_rng(20261121)
kept = {}                # name -> array, everything the program holds on to


def digest(a):
    return hashlib.sha256(np.ascontiguousarray(a).view(np.uint8)).hexdigest()[:16]


def report(name, a):
    print(f"{name:<22} {a.dtype.str:>4} {a.size:>10} sum={float(a.sum())!r} sha={digest(a)}")


# 1. Block-Jacobi-like iteration keeping previous iterates.
b = rng.standard_normal(N)
x = np.zeros(N)
blocks = 16
bs = N // blocks
history = []
for sweep in range(24):
    x_prev = x.copy()                    # keep the previous iterate
    k = (sweep * 5) % blocks             # one block updated per sweep
    s = slice(k * bs, (k + 1) * bs)
    x[s] = 0.5 * x_prev[s] + 0.25 * b[s] + 0.125 * np.roll(x_prev, 1)[s]
    if sweep % 3 == 0:
        history.append(x_prev)           # convergence history (kept)
    delta = float(np.abs(x - x_prev).max())
    print(f"sweep {sweep:2d} block {k:2d} max|dx|={delta!r}")
for i, h in enumerate(history):
    kept[f"iterate{i}"] = h
kept["x"] = x

# 2. Variants of a data set: copy, then modify a slice.
data = rng.standard_normal(N)
kept["data"] = data
for v in range(6):
    c = np.copy(data)
    lo = v * (N // 10)
    c[lo:lo + N // 50] *= 1.0 + v / 10.0      # 2% of the elements
    if v % 2:
        c[-1000:] = 0.0                       # and a tail reset
    kept[f"variant{v}"] = c

# 3. Slices, same-dtype astype, np.array, concatenation.
kept["first_half"] = data[: N // 2].copy()
kept["second_half"] = data[N // 2:].copy()
kept["astype_same"] = data.astype(np.float64)          # copies (copy=True)
kept["np_array"] = np.array(data)                      # copies
ints = rng.integers(0, 1_000_000, size=N, dtype=np.int64)
kept["ints"] = ints
kept["ints_copy"] = ints.copy()
kept["ints_copy"][::4096] += 1                         # one element per 32 KiB
kept["concat"] = np.concatenate([data, ints.astype(np.float64)[: N // 4], data[: N // 8]])
kept["every2nd"] = data[::2].copy()                    # strided: a real gather

# 4. A 2-D field: row edits vs a column edit.
m = rng.random((ROWS, COLS))
kept["m"] = m
m_rows = m.copy()
m_rows[100:120, :] = 0.0
kept["m_rows"] = m_rows
m_col = m.copy(order="C")
m_col[:, 7] = -1.0
kept["m_col"] = m_col
m_t = np.ascontiguousarray(m.T)                        # transpose: a real gather
kept["m_t"] = m_t
sub = m[500:2500, :].copy()                            # block of whole rows
sub[::100] *= 2.0
kept["m_sub"] = sub

total = 0
for name in sorted(kept):
    report(name, kept[name])
    total += kept[name].nbytes
print(f"arrays kept: {len(kept)}, {total / 2**20:.1f} MiB")
sys.stdout.flush()
