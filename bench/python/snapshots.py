"""A simulation that keeps snapshots of its state (for restart, plotting or
time-series analysis), as scientific codes do.

Explicit finite differences for heat diffusion with sources on a 1800x1800
float64 grid (25 MB), plus a tracer field advected by an upwind scheme and a
float32 "material" map that changes only where a front passes. Every 8
steps the state is snapshotted with `.copy()`: 25 snapshots of the three
fields. Heat and tracer spread one cell per step from a few hot spots, so far
from the sources the values stay exactly 0.0 and the snapshots hold many
zero pages; the material map changes little between snapshots.

Seeded; prints a deterministic summary (SHA-256 of every snapshot and exact
reductions). Plain about 10 s of CPU, 1.5 GB of snapshots.
"""
import hashlib

import numpy as np

NX = NY = 1800
STEPS = 200
EVERY = 8
rng = np.random.default_rng(4242)

u = np.zeros((NX, NY))                      # temperature
c = np.zeros((NX, NY))                      # tracer
mat = np.ones((NX, NY), dtype=np.float32)   # conductivity map
sources = [(int(rng.integers(100, NX - 300)), int(rng.integers(100, NY - 300))) for _ in range(4)]
alpha, dt = 0.2, 1.0
vx, vy = 0.3, 0.15

snapshots = []
lap = np.zeros((NX, NY))                    # work array, reused


def digest(a):
    return hashlib.sha256(a.view(np.uint8)).hexdigest()[:12]


for step in range(1, STEPS + 1):
    for (i, j) in sources:
        u[i - 2:i + 3, j - 2:j + 3] += 5.0
        c[i, j] = 1.0
    # diffusion: 5-point Laplacian weighted by the conductivity map
    lap[1:-1, 1:-1] = u[2:, 1:-1] + u[:-2, 1:-1] + u[1:-1, 2:] + u[1:-1, :-2] - 4.0 * u[1:-1, 1:-1]
    u += alpha * dt * mat * lap
    # upwind advection of the tracer (vx, vy > 0)
    c[1:, 1:] -= dt * (vx * (c[1:, 1:] - c[:-1, 1:]) + vy * (c[1:, 1:] - c[1:, :-1]))
    # material hardens where it got hot: changes only along the front
    if step % 4 == 0:
        front = (u > 50.0) & (mat > 0.5)
        mat[front] = 0.5
    if step % EVERY == 0:
        snapshots.append((step, u.copy(), c.copy(), mat.copy()))
        print(f"step {step:4d} heat={float(u.sum())!r} tracer={float(c.sum())!r} "
              f"hot_cells={int((u > 1e-12).sum())} hardened={int((mat < 1).sum())}")

for step, su, sc, sm in snapshots:
    print(f"snapshot {step:4d} u={digest(su)} c={digest(sc)} mat={digest(sm)}")
nbytes = sum(a.nbytes for s in snapshots for a in s[1:])
print(f"snapshots kept: {len(snapshots)}, {nbytes / 2**20:.1f} MiB")
