"""The installed pagefold package, as a user meets it: the command, python -m
pagefold, the Python API, and a Jupyter kernel running a notebook with the
%pagefold magic. Run inside a virtualenv where pip installed the wheel maturin
built, on a PATH without cargo or rustc (crates/cli/tests/python_package.rs
does that)."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import pagefold

SCRIPT = textwrap.dedent(
    """
    a = bytearray(32 << 20)
    for i in range(0, len(a), 4096):
        a[i] = i % 251
    copies = [bytearray(a) for _ in range(4)]
    print(sum(c[4096 * 17] for c in copies), len(copies[3]))
    """
)


def test_installed_and_run_without_a_rust_toolchain():
    assert shutil.which("cargo") is None and shutil.which("rustc") is None, os.environ.get("PATH")


def test_the_command_and_python_m_agree_on_the_version():
    exe = pagefold.binary()
    assert os.path.dirname(exe) == os.path.dirname(sys.executable)
    v1 = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True).stdout
    v2 = subprocess.run([sys.executable, "-m", "pagefold", "--version"], capture_output=True,
                        text=True, check=True).stdout
    assert v1 == v2 and v1.startswith("pagefold ")


def test_python_m_pagefold_run_gives_the_plain_output_and_exit_code(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(SCRIPT + "raise SystemExit(3)\n")
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAGEFOLD_")}
    env.pop("LD_LIBRARY_PATH", None)
    report = tmp_path / "report.json"
    under = subprocess.run([sys.executable, "-m", "pagefold", "run", "--json", "--report", str(report),
                            "--", sys.executable, str(script)], capture_output=True, text=True, env=env)
    assert plain.returncode == under.returncode == 3
    assert plain.stdout == under.stdout and plain.stdout.strip()
    doc = json.loads(report.read_text())
    assert doc["schema"] == "pagefold-run/1"
    engine = doc["runs"][-1]["engine"]
    assert engine and sum(e["stats"]["pages_shared_by_copy"] for e in engine) > 4 * 8000
    assert all(e["schema"] == "pagefold-preload-report/1" for e in engine)


def test_doctor_says_what_works_here():
    doc = pagefold.doctor()
    assert doc["schema"] == "pagefold-doctor/1"
    names = {c["name"] for c in doc["checks"]}
    assert {"userfaultfd system call", "/dev/userfaultfd", "memfd", "pagemap PFNs"} <= names
    works = {m["name"]: m["works"] for m in doc["mechanisms"]}
    assert works["virtual copies"]
    for c in doc["checks"]:
        if c["lost"]:
            assert not c["ok"] and c["fix"], c


def test_the_preload_library_comes_with_the_package():
    path = pagefold.preload_path()
    assert os.path.isfile(path) and path.endswith(".so")
    assert "LD_LIBRARY_PATH" not in os.environ


def test_footprint_of_this_process():
    fp = pagefold.footprint()
    assert fp["pids"] == [os.getpid()]
    assert fp["physical_bytes"] > 1 << 20
    assert fp["uss_bytes"] <= fp["pss_bytes"] <= fp["rss_bytes"]
    assert fp["schema"] == "pagefold-measure/1"
    assert fp["physical_bytes"] == fp["footprint_bytes"]


def test_analyze_this_process():
    rep = pagefold.analyze(os.getpid())
    assert isinstance(rep, dict) and rep
    assert rep["schema"] == "pagefold-analyze/1"


def test_run_returns_exit_code_and_report(tmp_path):
    script = tmp_path / "s.py"
    # The footprint is sampled every 50 ms: the program holds its memory for
    # several intervals so that the sampled peak sees it.
    script.write_text(SCRIPT + "import time\ntime.sleep(0.5)\n")
    out = pagefold.run([sys.executable, str(script)], scan_interval_ms=200)
    assert out["exit_code"] == 0
    assert out["report"]["schema"] == "pagefold-run/1"
    last = out["report"]["runs"][-1]
    assert last["samples"] >= 5 and last["peak_bytes"] > 32 << 20
    assert sum(e["stats"]["pages_shared_by_copy"] for e in last["engine"]) > 4 * 8000


def test_errors_are_one_line_exceptions():
    with pytest.raises(pagefold.PagefoldError) as e:
        pagefold.footprint(pid=2**22 + 12345)
    assert "\n" not in str(e.value)
    with pytest.raises(TypeError):
        pagefold.run("echo hi")


def test_engine_stats_inside_and_outside(tmp_path):
    assert pagefold.engine_stats() == {}  # pytest itself runs plain
    probe = tmp_path / "probe.py"
    probe.write_text(SCRIPT + "import json, pagefold\nprint(json.dumps(pagefold.engine_stats()))\n")
    done = subprocess.run([pagefold.binary(), "run", "--", sys.executable, str(probe)],
                          capture_output=True, text=True, check=True)
    stats = json.loads(done.stdout.strip().splitlines()[-1])
    assert stats["pages_shared_by_copy"] > 4 * 8000 and stats["frames_active"] is True
    assert stats["schema"] == "pagefold-engine-stats/1"


def test_a_notebook_on_the_pagefold_kernel(tmp_path):
    import nbformat
    from nbclient import NotebookClient

    prefix = tmp_path / "jupyter"
    done = subprocess.run([sys.executable, "-m", "pagefold", "kernel", "install", "--prefix", str(prefix),
                           "--name", "pagefold-test"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    kdir = prefix / "share/jupyter/kernels/pagefold-test"
    spec = json.loads((kdir / "kernel.json").read_text())
    assert spec["display_name"] == "Python 3 (pagefold)"
    assert os.path.isfile(spec["env"]["LD_PRELOAD"])
    os.environ["JUPYTER_PATH"] = str(prefix / "share/jupyter")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("%load_ext pagefold"),
        nbformat.v4.new_code_cell(SCRIPT),
        nbformat.v4.new_code_cell("%pagefold"),
        nbformat.v4.new_code_cell("%%pagefold\nmore = [bytearray(a) for _ in range(4)]"),
        nbformat.v4.new_code_cell("import pagefold; print(pagefold.engine_stats()['pages_shared_by_copy'] > 0)"),
    ]
    NotebookClient(nb, kernel_name="pagefold-test", timeout=300).execute()
    text = ["".join(o.get("text", "") for o in c.outputs) for c in nb.cells]
    assert "physical footprint" in text[2] and "copies made copy-on-write" in text[2], text[2]
    assert "before" in text[3] and "after" in text[3], text[3]
    assert text[4].strip() == "True", text
