"""numpy under the preload: array copies of every common kind, arrays with
zero and duplicate pages left for the scanner, and numpy's own
madvise(MADV_HUGEPAGE) on large arrays. Prints digests that must not depend
on whether pagefold is preloaded."""
import hashlib
import time

import numpy as np

N = 2_000_000  # 16 MB of int64: numpy asks for huge pages on these

a = np.arange(N, dtype=np.int64)
copies = [
    a.copy(),
    np.array(a),
    np.copy(a),
    a.astype(np.int64),  # same dtype: a copy
    np.ascontiguousarray(a[::1]).copy(),
]
e = np.empty_like(a)
e[...] = a
copies.append(e)
copies[2][12345] = -1  # one copy diverges
both = np.concatenate([a, a])

z = np.ones(N // 2)
z[:] = 0.0  # resident zero pages
dup = np.tile(np.arange(512, dtype=np.int64), N // 512)  # every page alike
time.sleep(0.1)  # scans

h = hashlib.sha256()
for arr in [a, *copies, both, z, dup]:
    h.update(arr.tobytes())
assert (copies[0] == a).all() and copies[2][12345] == -1 and a[12345] == 12345
assert (both[N:] == a).all() and not z.any() and (dup[512:1024] == np.arange(512)).all()
print(h.hexdigest(), int(copies[2].sum()), int(dup.sum()))
