"""pagefold on Dask workers: worker processes under the engine, Dask's memory
manager acting on their true footprint, the cluster's footprints and an
estimate of the pages its workers hold in common.

Dask's worker memory manager spills, pauses and terminates workers on the
process's RSS. Under the engine RSS is wrong both ways: it misses the
engine's frames that are not mapped yet, and counts a frame once per mapping
(every copy-on-write copy). This module gives Dask the true footprint
instead, read cheaply enough for the monitor's 100 ms interval
(``process_footprint``: anonymous and file-backed RSS from
/proc/PID/status, which count no shared-memory page, plus the allocated
blocks of every memfd the process holds, which count each engine frame
once, mapped or not).

- ``LocalCluster(...)``: a ``distributed.LocalCluster`` whose worker
  processes run under the engine.
- ``dask worker ADDR --preload-nanny pagefold.dask``: the same for workers
  started on other hosts (the nanny preload of this module). A worker
  started without a nanny: ``pagefold run -- dask worker ADDR --no-nanny
  --preload pagefold.dask``.
- ``footprints(client)``, ``report(client, plot=...)``: each worker's true
  footprint, RSS and engine statistics, as a dict, a table and a chart.
- ``sharing(client)``: pages duplicated across workers, estimated from a
  fixed sample of page fingerprints each worker takes of itself (the
  analyzer's ``--fingerprints``), next to what each worker saves inside
  itself.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import socket
import subprocess
import time
from functools import partial
from typing import Any, Dict, Iterable, List, Optional, Tuple

try:
    import distributed
    import psutil
    from distributed import Nanny, Worker
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError("pagefold.dask needs dask's distributed: pip install 'pagefold[dask]'") from e

import pagefold

__all__ = [
    "LocalCluster",
    "process_footprint",
    "footprints",
    "sharing",
    "report",
    "table",
    "plot",
    "dask_setup",
    "engine_loaded",
]

PRELOAD = "pagefold.dask"
PAGE = 4096
DEFAULT_RATE = 64
logger = logging.getLogger("pagefold.dask")


# --- The true footprint, cheaply ---------------------------------------------


def _status_bytes(pid: int) -> Dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(value.split()[0]) * 1024
    return out


def _memfd_bytes(pid: int) -> int:
    """Allocated bytes of the memfds ``pid`` holds open, each inode once."""
    seen = set()
    total = 0
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        path = f"{fd_dir}/{fd}"
        try:
            if not os.readlink(path).startswith("/memfd:"):
                continue
            st = os.stat(path)
        except OSError:  # closed meanwhile
            continue
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


def process_footprint(pid: Optional[int] = None) -> int:
    """The true footprint of ``pid`` (default: this process) in bytes, cheap
    enough to read every 100 ms: RssAnon + RssFile + the allocated bytes of
    the memfds it holds open (the engine's frames, counted once whether a
    frame is mapped zero, one or many times).

    It leaves out shared memory that is not a memfd the process holds open
    (SysV shm, /dev/shm files), and counts a file page mapped twice twice.
    ``pagefold.footprint()`` (distinct physical pages, ~40-250 ms per call)
    is the exact figure; docs/DASK.md gives how far the two are apart."""
    pid = os.getpid() if pid is None else pid
    status = _status_bytes(pid)
    return status.get("RssAnon", 0) + status.get("RssFile", 0) + _memfd_bytes(pid)


# --- Starting workers under the engine ----------------------------------------


def _as_list(value: Any) -> List[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return list(value)


class LocalCluster(distributed.LocalCluster):
    """A ``distributed.LocalCluster`` (same arguments) whose worker processes
    run under pagefold's engine, with the workers' and nannies' memory
    monitors on the true footprint. Needs worker processes: ``processes=False``
    (workers as threads of this process) is refused."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("processes") is False:
            raise ValueError("pagefold.dask.LocalCluster needs worker processes (processes=False was given)")
        kwargs["processes"] = True
        nanny_preloads = _as_list(kwargs.get("preload_nanny"))
        if PRELOAD not in nanny_preloads:
            nanny_preloads.append(PRELOAD)
        kwargs["preload_nanny"] = nanny_preloads
        super().__init__(*args, **kwargs)


def dask_setup(server: Any) -> None:
    """The preload hook (``--preload-nanny pagefold.dask`` for a nanny,
    ``--preload pagefold.dask`` for a worker)."""
    if isinstance(server, Nanny):
        _setup_nanny(server)
    elif isinstance(server, Worker):
        _setup_worker(server)
    else:
        raise ValueError(
            f"pagefold.dask is a nanny or worker preload, not one for {type(server).__name__}"
        )


def _with_library(current: Optional[str], library: str) -> str:
    parts = [p for p in (current or "").replace(":", " ").split() if p]
    return " ".join([library] + [p for p in parts if p != library])


_spawning = 0
_environ_before: Optional[str] = None


def _setup_nanny(nanny: Nanny) -> None:
    """Before the nanny starts its worker: the preload library in the
    environment the worker process is spawned with, this module among the
    worker's preloads, and the nanny's terminate check on the true footprint."""
    if not engine_loaded():
        # A nanny already under the engine (`pagefold run -- dask worker`)
        # passes its own LD_PRELOAD on; otherwise the worker gets it here.
        library = pagefold.preload_path()
        nanny.pre_spawn_env["LD_PRELOAD"] = _with_library(nanny.pre_spawn_env.get("LD_PRELOAD"), library)
    worker_preloads = _as_list(nanny.preload)
    if PRELOAD not in worker_preloads:
        worker_preloads.append(PRELOAD)
    nanny.preload = worker_preloads
    _restore_environ_after_spawn(nanny)
    monitor = nanny.periodic_callbacks.get("memory_monitor")
    if monitor is not None:
        monitor.callback = partial(_nanny_memory_monitor, nanny)


def _restore_environ_after_spawn(nanny: Nanny) -> None:
    """distributed applies pre-spawn-environ to this process's own
    environment; LD_PRELOAD is put back once no worker is being spawned, so
    that other programs this process starts do not run under the engine."""
    start = nanny.instantiate

    async def instantiate() -> Any:
        global _spawning, _environ_before
        if _spawning == 0:
            _environ_before = os.environ.get("LD_PRELOAD")
        _spawning += 1
        try:
            return await start()
        finally:
            _spawning -= 1
            if _spawning == 0:
                if _environ_before is None:
                    os.environ.pop("LD_PRELOAD", None)
                else:
                    os.environ["LD_PRELOAD"] = _environ_before

    nanny.instantiate = instantiate


def _nanny_memory_monitor(nanny: Nanny) -> None:
    """distributed's NannyMemoryManager.memory_monitor, on the worker's true
    footprint instead of its RSS: terminate the worker above the terminate
    fraction of its limit (SIGTERM, then SIGKILL if it is still there)."""
    manager = nanny.memory_manager
    process = getattr(nanny.process, "process", None)
    if nanny.status != distributed.core.Status.running or process is None or process.pid is None:
        return
    try:
        memory = process_footprint(process.pid)
    except OSError:
        return
    limit = manager.memory_limit
    fraction = manager.memory_terminate_fraction
    if not limit or fraction is False or memory / limit <= fraction:
        return
    if manager._last_terminated_pid != process.pid:
        logger.warning(
            "Worker %s (pid=%d) exceeded %.0f%% memory budget (true footprint %d bytes). Restarting...",
            nanny.worker_address, process.pid, fraction * 100, memory,
        )
        manager._last_terminated_pid = process.pid
        nanny.log_event(
            "worker-restart-memory",
            {"worker": nanny.worker_address, "pid": process.pid, "rss": memory, "footprint": memory},
        )
        process.terminate()
    else:
        logger.warning("Worker %s (pid=%d) is slow to terminate; killing it", nanny.worker_address, process.pid)
        process.kill()


def engine_loaded() -> bool:
    """True if the preload library is loaded into this process (its
    statistics stay empty until the engine serves a first allocation)."""
    try:
        ctypes.CDLL(None).pagefold_stats_json
    except (AttributeError, OSError):
        return False
    return True


def _setup_worker(worker: Worker) -> None:
    """Dask's worker monitor (spill, pause, terminate, the dashboard) reads
    the true footprint from now on."""
    pid = os.getpid()
    worker.monitor.get_process_memory = partial(process_footprint, pid)
    if not engine_loaded():
        logger.warning(
            "pagefold.dask: worker %s does not run under the engine (start it with "
            "--preload-nanny pagefold.dask, or under `pagefold run`); its memory is "
            "still read as its true footprint", worker.address,
        )


# --- The cluster's footprints -------------------------------------------------


def _worker_footprint(dask_worker: Worker) -> Dict[str, Any]:
    exact = pagefold.footprint()
    monitor = dask_worker.monitor
    times = list(monitor.quantities.get("time", ()))
    memory = list(monitor.quantities.get("memory", ()))
    spilled = getattr(dask_worker.data, "spilled_total", None)
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "physical_bytes": exact["physical_bytes"],
        "method": exact.get("method"),
        "monitor_bytes": monitor.get_process_memory(),
        "rss_bytes": psutil.Process().memory_info().rss,
        "memory_limit": dask_worker.memory_manager.memory_limit,
        "spilled_bytes": getattr(spilled, "disk", 0) if spilled is not None else 0,
        "engine_loaded": engine_loaded(),
        "engine": pagefold.engine_stats(),
        "history": list(zip(times, memory)),
    }


async def _worker_footprint_async(dask_worker: Worker) -> Dict[str, Any]:
    # In a thread: pagefold.footprint() runs the measure command (tens to
    # hundreds of ms) and the worker's event loop keeps serving meanwhile.
    return await asyncio.get_running_loop().run_in_executor(None, _worker_footprint, dask_worker)


def footprints(client: "distributed.Client") -> Dict[str, Dict[str, Any]]:
    """Per worker address: ``physical_bytes`` (the true footprint,
    ``pagefold.footprint()`` inside the worker), ``monitor_bytes`` (what
    Dask's memory manager reads now), ``rss_bytes``, ``spilled_bytes``,
    ``memory_limit``, ``engine`` (``pagefold.engine_stats()`` inside the
    worker; ``{}`` when it does not run under the engine), ``history`` (the
    monitor's (time, bytes) samples: the footprint over time), ``pid`` and
    ``host``."""
    return client.run(_worker_footprint_async)


def _saved_by_mechanism(engine: Dict[str, Any]) -> Dict[str, int]:
    """Bytes the engine saves now, and what its mechanisms did in total."""
    return {
        "saved now": (engine.get("pages_saved_by_sharing", 0) + engine.get("evicted_now", 0)) * PAGE,
        "copies made copy-on-write": engine.get("pages_shared_by_copy", 0) * PAGE,
        "zero pages folded": engine.get("zero_folded", 0) * PAGE,
        "identical pages merged": engine.get("merged", 0) * PAGE,
        "evicted now": engine.get("evicted_now", 0) * PAGE,
    }


def _mib(n: float) -> str:
    return f"{n / (1 << 20):.1f}"


def table(prints: Dict[str, Dict[str, Any]]) -> str:
    """``footprints()``'s result as a plain-text table (MiB)."""
    heads = ["worker", "pid", "true", "monitor", "RSS", "spilled", "saved now", "CoW copies", "zero", "merged"]
    rows = []
    for address, w in sorted(prints.items()):
        saved = _saved_by_mechanism(w.get("engine") or {})
        engine = bool(w.get("engine"))
        rows.append([
            address, str(w["pid"]), _mib(w["physical_bytes"]), _mib(w["monitor_bytes"]),
            _mib(w["rss_bytes"]), _mib(w["spilled_bytes"]),
            *((_mib(saved[k]) for k in ("saved now", "copies made copy-on-write", "zero pages folded",
                                         "identical pages merged")) if engine else ["no engine"] + [""] * 3),
        ])
    widths = [max(len(r[i]) for r in rows + [heads]) for i in range(len(heads))]
    lines = ["  ".join(h.rjust(wd) if i else h.ljust(wd) for i, (h, wd) in enumerate(zip(heads, widths)))]
    for r in rows:
        lines.append("  ".join(c.rjust(wd) if i else c.ljust(wd) for i, (c, wd) in enumerate(zip(r, widths))))
    total = sum(w["physical_bytes"] for w in prints.values())
    lines.append(f"true footprint of the {len(prints)} workers: {_mib(total)} MiB "
                 "(MiB; monitor = what Dask's memory manager reads; CoW copies, zero, merged: totals since start)")
    return "\n".join(lines)


def plot(prints: Dict[str, Dict[str, Any]], path: str) -> str:
    """Writes a PNG: footprint per worker over time, and savings by mechanism.
    Needs matplotlib; raises ImportError with the install command otherwise."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("the plot needs matplotlib, which is not installed: pip install matplotlib") from e
    fig, (over_time, savings) = plt.subplots(1, 2, figsize=(12, 4.5))
    for address, w in sorted(prints.items()):
        history = w.get("history") or []
        if history:
            t0 = history[0][0]
            over_time.plot([t - t0 for t, _ in history], [m / (1 << 20) for _, m in history], label=address)
    over_time.set_xlabel("seconds")
    over_time.set_ylabel("true footprint (MiB)")
    over_time.set_title("footprint per worker (Dask's monitor)")
    over_time.legend(fontsize=7)
    names = ["saved now", "copies made copy-on-write", "zero pages folded", "identical pages merged"]
    workers = sorted(prints)
    width = 0.8 / max(len(workers), 1)
    for i, address in enumerate(workers):
        saved = _saved_by_mechanism(prints[address].get("engine") or {})
        savings.bar([j + i * width for j in range(len(names))], [saved[n] / (1 << 20) for n in names],
                    width=width, label=address)
    savings.set_xticks([j + 0.4 - width / 2 for j in range(len(names))])
    savings.set_xticklabels(names, fontsize=8, rotation=10)
    savings.set_ylabel("MiB")
    savings.set_title("engine savings by mechanism")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def report(client: "distributed.Client", plot_path: Optional[str] = None) -> Dict[str, Dict[str, Any]]:
    """Prints the cluster's table and, with ``plot_path``, writes the chart
    there (or says why not: matplotlib is optional). Returns ``footprints()``."""
    prints = footprints(client)
    print(table(prints))
    if plot_path is not None:
        try:
            print(f"chart written to {plot(prints, plot_path)}")
        except ImportError as e:
            print(f"no chart: {e}")
    return prints


# --- Sharing across workers ---------------------------------------------------

KINDS = "anon,heap,stack"


def _clean_env() -> Dict[str, str]:
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    return env


def _analyze(args: List[str]) -> Dict[str, Any]:
    done = subprocess.run([pagefold.binary(), "analyze", *args, "--json", "-q"],
                          capture_output=True, text=True, env=_clean_env())
    if done.returncode != 0:
        msg = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise pagefold.PagefoldError(msg)
    return json.loads(done.stdout)


def _worker_fingerprints(rate: int) -> Dict[str, Any]:
    doc = _analyze([str(os.getpid()), "--only", "fingerprints", "--fingerprints", str(rate),
                    "--kind", KINDS, "--threads", "1"])
    sample = doc["fingerprints"]["inputs"][0]
    sample["pid"] = os.getpid()
    sample["host"] = socket.gethostname()
    return sample


async def _worker_fingerprints_async(rate: int) -> Dict[str, Any]:
    return await asyncio.get_running_loop().run_in_executor(None, _worker_fingerprints, rate)


def estimate(samples: Dict[str, Dict[str, Any]], rate: int) -> Dict[str, Any]:
    """The sharing estimate from per-worker fingerprint samples (the
    analyzer's ``fingerprints.inputs`` entries): every sampled page stands
    for ``rate`` pages."""
    workers = {}
    contents_everywhere = set()
    sum_distinct = 0
    for address, s in samples.items():
        hashes = {h: (n, frames) for h, n, frames in s["sampled"]}
        contents_everywhere.update(hashes)
        sum_distinct += len(hashes)
        frames_known = any(frames for _, frames in hashes.values())
        within = (s["sampled_pages"] - len(hashes)) * rate + max(s["zero_pages"] - 1, 0)
        entry = {
            "pid": s.get("pid"),
            "pages": s["pages"],
            "zero_pages": s["zero_pages"],
            "sampled_pages": s["sampled_pages"],
            "sampled_contents": len(hashes),
            "duplicate_pages_within": within,
        }
        if frames_known:
            on_shared_frames = sum(n - frames for n, frames in hashes.values()) * rate
            entry["already_on_shared_frames"] = on_shared_frames
        workers[address] = entry
    across = (sum_distinct - len(contents_everywhere)) * rate
    return {
        "schema": "pagefold-dask-sharing/1",
        "rate": rate,
        "workers": workers,
        "duplicate_pages_across": across,
        "duplicate_bytes_across": across * PAGE,
        "duplicate_pages_within": sum(w["duplicate_pages_within"] for w in workers.values()),
        "sampled_contents_across": sum_distinct - len(contents_everywhere),
    }


def exact_sharing(pids: Iterable[int]) -> Dict[str, Any]:
    """The exact counts the estimate stands for, by reading every page of
    the processes (on this host): ``pagefold analyze PID... --only sharing``.
    ``duplicate_pages_across`` is what merging across the processes adds to
    merging inside each (the analyzer's ``cross_adds_pages``)."""
    doc = _analyze([str(p) for p in pids] + ["--only", "sharing", "--kind", KINDS])
    breakdown = doc["breakdown"]
    per_input = breakdown.get("per_input") or [breakdown]
    return {
        "duplicate_pages_across": (breakdown.get("cross") or {}).get("cross_adds_pages", 0),
        "duplicate_pages_within": [c["pages"] - c["after_sharing"] for c in per_input],
        "pages": [c["pages"] for c in per_input],
    }


def sharing(client: "distributed.Client", rate: int = DEFAULT_RATE, exact: bool = False) -> Dict[str, Any]:
    """How many pages the workers hold in common, estimated from a fixed
    1/``rate`` sample of page fingerprints each worker takes of its own
    anonymous memory (``pagefold analyze PID --fingerprints RATE`` inside
    the worker; reading its own pages needs the right to ptrace it, which a
    process has over its children as the same user, or root).

    ``duplicate_pages_across``: pages that merging across the workers (or
    co-locating them on one host with cross-process merging) would save
    beyond merging inside each; per worker, ``duplicate_pages_within``:
    pages whose content the same worker holds elsewhere (under the engine
    much of it is saved already: ``already_on_shared_frames``). With
    ``exact=True`` and every worker on this host, the exact counts from
    reading every page are added under ``exact``."""
    if not isinstance(rate, int) or rate < 1:
        raise ValueError(f"rate {rate!r}: give a whole number of pages, 1 or more")
    samples = client.run(_worker_fingerprints_async, rate)
    out = estimate(samples, rate)
    if exact:
        host = socket.gethostname()
        if any(s["host"] != host for s in samples.values()):
            raise ValueError("exact=True reads every worker's pages from here: all workers must run on this host")
        addresses = sorted(samples)
        counts = exact_sharing(samples[a]["pid"] for a in addresses)
        out["exact"] = {
            "duplicate_pages_across": counts["duplicate_pages_across"],
            "workers": {
                a: {"pages": p, "duplicate_pages_within": d}
                for a, p, d in zip(addresses, counts["pages"], counts["duplicate_pages_within"])
            },
        }
    return out
