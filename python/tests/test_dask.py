"""pagefold.dask on a real LocalCluster of two worker processes: the workers
run under the engine, Dask's memory manager (worker and nanny) reads their
true footprint, and footprints() and sharing() report known data. Each
worker holds a 128 MiB array and three copies of it, every page read."""

import os

import pytest

distributed = pytest.importorskip("distributed")
import pagefold  # noqa: E402
import pagefold.dask as pfd  # noqa: E402

MiB = 1 << 20
ARRAY_MIB = 128


def hold_array_and_copies(seed, dask_worker=None):
    import numpy as np

    a = np.random.default_rng(seed).integers(0, 1 << 62, size=ARRAY_MIB * MiB // 8)
    copies = [a.copy() for _ in range(3)]
    dask_worker._pagefold_test_data = (a, copies)
    # Reads every page of every copy, so the copies are mapped (RSS sees them).
    return int(sum(int(c.sum() & 0xFF) for c in copies))


def start(cluster_class, limit):
    cluster = cluster_class(n_workers=2, threads_per_worker=1, memory_limit=limit,
                            dashboard_address=":0", silence_logs=40)
    client = distributed.Client(cluster)
    sums = client.run(hold_array_and_copies, 7)
    assert len(set(sums.values())) == 1
    return cluster, client


@pytest.fixture(scope="module")
def engine_cluster():
    # 700 MiB per worker: a worker's RSS (about 630 MiB with its copies mapped,
    # plus the interpreter) would cross the nanny's terminate threshold (95%)
    # and the pause threshold (80%); its true footprint (about 230 MiB) crosses none.
    cluster, client = start(pfd.LocalCluster, "700MiB")
    yield client
    client.close()
    cluster.close()


def test_workers_run_under_the_engine(engine_cluster):
    stats = engine_cluster.run(lambda: (pfd.engine_loaded(), pagefold.engine_stats()))
    for loaded, engine in stats.values():
        assert loaded
        assert engine["pages_shared_by_copy"] >= 3 * ARRAY_MIB * MiB // 4096
    # The environment of this (the client's) process is left as it was.
    assert "libpagefold" not in os.environ.get("LD_PRELOAD", "")


def test_memory_manager_reads_the_true_footprint(engine_cluster):
    prints = pfd.footprints(engine_cluster)
    assert len(prints) == 2
    for w in prints.values():
        true, monitor, rss = w["physical_bytes"], w["monitor_bytes"], w["rss_bytes"]
        assert w["method"] == "pfn"
        assert abs(monitor - true) <= 0.1 * true, (monitor, true)
        assert rss > 2 * true  # RSS counts every mapped copy
        assert w["spilled_bytes"] == 0
        assert w["engine"]["pages_shared_by_copy"] > 0
        assert w["history"] and all(m < 0.5 * w["memory_limit"] for _, m in w["history"][-2:])
    # Neither paused nor restarted by the nanny although RSS is above 90% of the limit.
    info = engine_cluster.scheduler_info()["workers"]
    assert all(ws["status"] == "running" for ws in info.values())
    assert {w["pid"] for w in prints.values()} == {w["pid"] for w in pfd.footprints(engine_cluster).values()}
    for nanny in engine_cluster.cluster.workers.values():
        assert nanny.periodic_callbacks["memory_monitor"].callback.func is pfd._nanny_memory_monitor


def test_half_the_true_footprint_of_plain_workers(engine_cluster):
    cluster, client = start(distributed.LocalCluster, "2GiB")
    try:
        plain = pfd.footprints(client)
    finally:
        client.close()
        cluster.close()
    under = pfd.footprints(engine_cluster)
    plain_total = sum(w["physical_bytes"] for w in plain.values())
    under_total = sum(w["physical_bytes"] for w in under.values())
    assert all(not w["engine_loaded"] for w in plain.values())
    assert under_total <= 0.5 * plain_total, (under_total, plain_total)


def test_sharing_estimate_against_the_exact_count(engine_cluster):
    out = pfd.sharing(engine_cluster, rate=16, exact=True)
    assert out["schema"] == "pagefold-dask-sharing/1"
    exact = out["exact"]["duplicate_pages_across"]
    array_pages = ARRAY_MIB * MiB // 4096
    # Both workers hold the same array: at least its pages are duplicated.
    assert exact >= array_pages
    assert abs(out["duplicate_pages_across"] - exact) <= 0.15 * exact, (out["duplicate_pages_across"], exact)
    for address, w in out["workers"].items():
        # The three copies duplicate the array inside each worker, on shared frames.
        assert w["duplicate_pages_within"] >= 2.5 * array_pages
        assert w["already_on_shared_frames"] >= 2.5 * array_pages
        e = out["exact"]["workers"][address]["duplicate_pages_within"]
        assert abs(w["duplicate_pages_within"] - e) <= 0.15 * e


def test_report_prints_the_table_and_says_why_there_is_no_chart(engine_cluster, tmp_path, capsys):
    try:
        import matplotlib  # noqa: F401
        has_matplotlib = True
    except ImportError:
        has_matplotlib = False
    pfd.report(engine_cluster, plot_path=str(tmp_path / "cluster.png"))
    text = capsys.readouterr().out
    assert "true footprint of the 2 workers" in text
    if has_matplotlib:
        assert (tmp_path / "cluster.png").stat().st_size > 0
    else:
        assert "no chart: the plot needs matplotlib, which is not installed: pip install matplotlib" in text


def test_threads_instead_of_processes_are_refused():
    with pytest.raises(ValueError, match="needs worker processes"):
        pfd.LocalCluster(processes=False)


def test_the_cheap_footprint_of_a_plain_process_matches_the_exact_one():
    true = pagefold.footprint()["physical_bytes"]
    assert abs(pfd.process_footprint() - true) <= 0.1 * true


def test_a_scheduler_preload_is_refused():
    with pytest.raises(ValueError, match="nanny or worker preload"):
        pfd.dask_setup(object())
