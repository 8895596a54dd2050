"""A dask.dataframe job that keeps defensive copies of its partitions beside
the originals, on a LocalCluster of two worker processes whose
``memory_limit`` makes plain Dask spill.

The job, as analysis code writes it: a table of PARTS partitions (8 float
columns and an integer key, ROWS rows each) is loaded and persisted; a
cleaning step copies every partition before touching it (``part.copy()``
in ``map_partitions``, the defensive copy pandas users make against
SettingWithCopy surprises) and adds two derived columns; the cleaned table
is persisted too and both are kept, because later cells compare them.
Then a group-by on each and a sum over the derived columns.
``map_partitions`` runs on the worker holding the partition, so each copy
is made where its source is.

The cluster: ``pagefold.dask.LocalCluster`` when this process runs under
the engine (``pagefold run``, or ``pagefold bench`` in a pagefold
configuration; the workers inherit the preload library), otherwise
``distributed.LocalCluster``; in both the workers' memory monitor reads
``pagefold.dask.process_footprint`` (for a plain worker: RssAnon + RssFile)
every 100 ms. ``--spill-on process-memory`` sets Dask's ``target`` to False:
the worker then spills only on its process memory (above 70% of the limit),
not on the sum of ``sizeof()`` of its keys (above 60%), which counts every
copy at full size whatever it holds.

stdout: the results (identical in every configuration). stderr, last line:
``bench-metrics {JSON}`` with the bytes spilled to disk and read back
(all workers), the peak footprint of each worker (the monitor's samples),
what the workers' engines shared by copy (their counter, read inside the
workers before the cluster stops: a worker stopped by its nanny writes no
exit report) and the job's wall time, which ``pagefold bench --suite
dask`` tabulates.

    python3 bench/dask/frame_copies.py [--quick] [--spill-on managed|process-memory]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import dask
import dask.dataframe as dd
import distributed
import numpy as np
import pandas as pd

try:
    import pagefold
    import pagefold.dask as pfd
except ImportError:
    # The checkout's package (bench/dask/ -> python/), for this process and the workers.
    checkout = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
    sys.path.insert(0, os.path.abspath(checkout))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (sys.path[0], os.environ.get("PYTHONPATH")) if p)
    import pagefold
    import pagefold.dask as pfd

MiB = 1 << 20
FULL = {"parts": 12, "rows": 1_000_000, "limit_mib": 1280}
QUICK = {"parts": 4, "rows": 100_000, "limit_mib": 1024}


def load_partition(i, rows):
    rng = np.random.default_rng(1000 + i)
    part = pd.DataFrame({f"x{j}": rng.normal(size=rows) for j in range(8)})
    part["key"] = rng.integers(0, 1000, rows)
    return part


def clean(part):
    part = part.copy()
    part["ratio"] = part["x0"] / (part["x1"].abs() + 1.0)
    part["score"] = part["x2"] * 0.5 + part["x3"]
    return part


def worker_metrics(dask_worker=None):
    digests = dask_worker.digests_total
    written = sum(v for k, v in digests.items() if isinstance(k, tuple) and k[-2:] == ("disk-write", "bytes"))
    read = sum(v for k, v in digests.items() if isinstance(k, tuple) and k[-2:] == ("disk-read", "bytes"))
    peak = max(dask_worker.monitor.quantities["memory"], default=0)
    shared = pagefold.engine_stats().get("pages_shared_by_copy", 0)
    return {"spilled": written, "unspilled": read, "peak": peak, "shared": shared}


def start_cluster(limit_mib, scratch):
    kwargs = dict(n_workers=2, threads_per_worker=1, memory_limit=f"{limit_mib}MiB",
                  dashboard_address=":0", silence_logs=40, local_directory=scratch)
    if pfd.engine_loaded():
        return pfd.LocalCluster(**kwargs)
    return distributed.LocalCluster(preload=["pagefold.dask"], **kwargs)


def run_job(client, parts, rows):
    raw = dd.from_map(load_partition, range(parts), rows=rows).persist()
    cleaned = raw.map_partitions(clean).persist()
    distributed.wait([raw, cleaned])
    by_key_raw = raw.groupby("key").x4.mean()
    by_key_clean = cleaned.groupby("key").agg({"ratio": "mean", "score": "max"})
    totals = cleaned[["ratio", "score"]].sum()
    rows_kept = raw.shape[0] + cleaned.shape[0]
    by_key_raw, by_key_clean, totals, rows_kept = dask.compute(by_key_raw, by_key_clean, totals, rows_kept)
    by_key_raw = by_key_raw.sort_index()
    by_key_clean = by_key_clean.sort_index()
    return [
        f"rows kept {rows_kept}",
        f"keys {len(by_key_raw)} x4 mean of means {by_key_raw.mean():.9e}",
        f"ratio mean of means {by_key_clean['ratio'].mean():.9e}",
        f"score max of maxes {by_key_clean['score'].max():.9e}",
        f"sums ratio {totals['ratio']:.9e} score {totals['score']:.9e}",
    ]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small table, for tests (seconds)")
    ap.add_argument("--spill-on", choices=["managed", "process-memory"], default="managed",
                    help="managed: Dask's defaults; process-memory: target=False")
    a = ap.parse_args(argv)
    size = QUICK if a.quick else FULL
    settings = {"distributed.admin.system-monitor.interval": "100ms"}
    if a.spill_on == "process-memory":
        settings["distributed.worker.memory.target"] = False
    with dask.config.set(settings), tempfile.TemporaryDirectory(prefix="frame-copies-") as scratch:
        with start_cluster(size["limit_mib"], scratch) as cluster, distributed.Client(cluster) as client:
            start = time.perf_counter()
            lines = run_job(client, size["parts"], size["rows"])
            wall = time.perf_counter() - start
            time.sleep(0.3)  # a last monitor sample
            per_worker = client.run(worker_metrics)
    for line in lines:
        print(line)
    metrics = {
        "job_wall_s": round(wall, 3),
        "spilled_mib": sum(w["spilled"] for w in per_worker.values()) / MiB,
        "unspilled_mib": sum(w["unspilled"] for w in per_worker.values()) / MiB,
        "worker_peak_mib": max(w["peak"] for w in per_worker.values()) / MiB,
        "worker_peaks_mib": sorted(w["peak"] / MiB for w in per_worker.values()),
        "workers_shared_by_copy_mib": sum(w["shared"] for w in per_worker.values()) * 4096 / MiB,
        "engine": pfd.engine_loaded(),
    }
    print("bench-metrics " + json.dumps(metrics), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
