"""Dask side by side, plain and under pagefold: a chunked dask.array
pipeline that keeps copies, on a LocalCluster of two worker processes with a
memory limit per worker that makes plain Dask spill.

The job: an array of SIZE MiB in 64 MiB chunks is persisted, then three
copies of it (a copy of every chunk) are persisted beside
it, then the sum over the array and its copies is computed. Plain workers
hold four times the array; under pagefold the copies share the array's
frames until written.

Each run starts a fresh cluster: plain (`distributed.LocalCluster`, worker
preload pagefold.dask so that the monitor's history is the true footprint,
which for a plain worker is its RSS: RssAnon + RssFile) or pagefold
(`pagefold.dask.LocalCluster`). Runs alternate plain, pagefold, plain, ...;
per configuration the medians of wall time, bytes spilled to disk (all
workers) and peak true footprint per worker (the monitor's samples, every
0.5 s) are printed as a Markdown table, and every run as JSON with --json.

    python3 bench/dask/pipeline.py [--runs 3] [--size-mib 1536] [--limit-mib 1536]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import dask.array as da
import distributed

import pagefold.dask as pfd

MiB = 1 << 20
CHUNK_MIB = 64


def copy_block(block, which):
    return block.copy()


def spilled_bytes(dask_worker=None):
    return sum(v for k, v in dask_worker.digests_total.items()
               if isinstance(k, tuple) and k[-2:] == ("disk-write", "bytes"))


def peak_footprint(dask_worker=None):
    return max(dask_worker.monitor.quantities["memory"], default=0)


def one_run(config, size_mib, limit_mib):
    kwargs = dict(n_workers=2, threads_per_worker=1, memory_limit=f"{limit_mib}MiB",
                  dashboard_address=":0", silence_logs=40)
    if config == "plain":
        cluster = distributed.LocalCluster(preload=["pagefold.dask"], **kwargs)
    else:
        cluster = pfd.LocalCluster(**kwargs)
    with cluster, distributed.Client(cluster) as client:
        side = int((size_mib * MiB // 8) ** 0.5)
        chunk = int((CHUNK_MIB * MiB // 8) ** 0.5)
        start = time.perf_counter()
        x = da.random.default_rng(1).random((side, side), chunks=(chunk, chunk)).persist()
        # x.copy() of a many-chunk array is x itself: each copy is a task per chunk.
        copies = client.persist([x.map_blocks(copy_block, i, dtype=x.dtype) for i in range(3)])
        distributed.wait([x, *copies])
        total = float((x.sum() + sum(c.sum() for c in copies)).compute())
        wall = time.perf_counter() - start
        time.sleep(1.0)  # one more monitor sample at the end
        return {
            "config": config,
            "wall_s": wall,
            "result": round(total, 3),
            "spilled_bytes": sum(client.run(spilled_bytes).values()),
            "peak_footprint_per_worker": sorted(client.run(peak_footprint).values()),
        }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--size-mib", type=int, default=1536, help="the array (default 1536 MiB)")
    ap.add_argument("--limit-mib", type=int, default=1536, help="memory_limit per worker (default 1536 MiB)")
    ap.add_argument("--json", action="store_true", help="also print every run as JSON")
    a = ap.parse_args(argv)
    if a.runs < 1 or a.size_mib < CHUNK_MIB or a.limit_mib < 256:
        print("pipeline.py: give --runs >= 1, --size-mib >= 64, --limit-mib >= 256", file=sys.stderr)
        return 2
    runs = []
    for i in range(a.runs):
        for config in ("plain", "pagefold"):
            r = one_run(config, a.size_mib, a.limit_mib)
            print(f"run {i + 1} {config}: {r['wall_s']:.1f} s, spilled {r['spilled_bytes'] / MiB:.0f} MiB, "
                  f"peak per worker {[round(p / MiB) for p in r['peak_footprint_per_worker']]} MiB",
                  file=sys.stderr)
            runs.append(r)
    if len({r["result"] for r in runs}) != 1:
        print(f"pipeline.py: the runs computed different results: {sorted({r['result'] for r in runs})}",
              file=sys.stderr)
        return 1
    print(f"array {a.size_mib} MiB + 3 copies, 2 workers x 1 thread, memory_limit {a.limit_mib} MiB per worker, "
          f"{a.runs} runs each, interleaved; medians\n")
    print("| configuration | wall time (s) | spilled to disk (MiB) | peak true footprint per worker (MiB) |")
    print("|---|---:|---:|---:|")
    for config in ("plain", "pagefold"):
        mine = [r for r in runs if r["config"] == config]
        wall = statistics.median(r["wall_s"] for r in mine)
        spilled = statistics.median(r["spilled_bytes"] for r in mine) / MiB
        peak = statistics.median(max(r["peak_footprint_per_worker"]) for r in mine) / MiB
        print(f"| {config} | {wall:.1f} | {spilled:.0f} | {peak:.0f} |")
    if a.json:
        print(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
