"""pagefold from Python: true footprints, analysis, running programs under the
engine, and the engine's own statistics when this process runs under it.

The measurements and the engine are the ``pagefold`` command installed with
this package (a Rust binary that carries the preload library); these
functions call it and return its JSON as dictionaries. ``engine_stats`` asks
the preload library loaded into this very process, if there is one.

Every JSON document pagefold writes has a ``"schema"`` field naming its
format and version (the number changes when a field changes meaning or goes
away), and the dictionaries keep it; each function says which it is.
``run`` wraps its report with the exit code: ``run(...)["report"]["schema"]``.

    >>> import pagefold
    >>> pagefold.footprint()["physical_bytes"]        # this process
    >>> pagefold.run(["python3", "script.py"])["exit_code"]
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from typing import Any, Dict, List, Optional, Sequence, Union

__all__ = ["footprint", "analyze", "run", "doctor", "engine_stats", "binary", "preload_path", "PagefoldError"]


class PagefoldError(RuntimeError):
    """The pagefold command failed; the message is its one-line error."""


def binary() -> str:
    """The path of the ``pagefold`` command installed with this package."""
    name = "pagefold"
    scripts = sysconfig.get_path("scripts")
    for candidate in (os.path.join(scripts, name), os.path.join(os.path.dirname(sys.executable), name)):
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which(name)
    if found is None:
        raise PagefoldError("the pagefold command is not installed (pip install pagefold)")
    return found


def _call(args: Sequence[str]) -> str:
    done = subprocess.run([binary(), *args], capture_output=True, text=True)
    if done.returncode != 0:
        msg = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise PagefoldError(msg)
    return done.stdout


def preload_path() -> str:
    """The preload library ``pagefold run`` loads into programs."""
    return _call(["preload"]).strip()


def footprint(pid: Optional[int] = None, tree: bool = False) -> Dict[str, Any]:
    """The true physical footprint of process ``pid`` (default: this one).

    ``physical_bytes`` counts every distinct physical page the process maps,
    plus memfd pages it holds but does not map; ``rss_bytes``, ``pss_bytes``
    and ``uss_bytes`` are the kernel's figures; ``ksm`` what kernel KSM
    merged. With ``tree=True`` the process's descendants are included, pages
    they share counted once. It is ``pagefold measure --json``'s document
    (``"schema": "pagefold-measure/1"``) with ``physical_bytes`` added, the
    same as its ``footprint_bytes``.
    """
    args = ["measure", str(os.getpid() if pid is None else pid), "--json"]
    if tree:
        args.append("--tree")
    out = json.loads(_call(args))
    out["physical_bytes"] = out.get("footprint_bytes")
    return out


def analyze(target: Union[int, str, "os.PathLike[str]"]) -> Dict[str, Any]:
    """What sharing, patching and compression could save on a process (a
    PID) or a memory image or core file (a path): the analyzer's report,
    ``pagefold analyze --json``'s document (``"schema": "pagefold-analyze/1"``)."""
    return json.loads(_call(["analyze", str(os.fspath(target) if not isinstance(target, int) else target), "--json"]))


def run(argv: Sequence[str], **options: Union[str, int, bool]) -> Dict[str, Any]:
    """Runs ``argv`` under the engine and waits for it.

    Keyword options become engine settings: ``tier=True`` sets
    ``PAGEFOLD_TIER=1``, ``scan_interval_ms=500`` sets
    ``PAGEFOLD_SCAN_INTERVAL_MS=500`` (docs/CONFIG.md lists them all).
    Returns ``exit_code`` (the program's; negative for a signal) and
    ``report`` (footprint over time and what the engine did): the document
    of ``pagefold run --json`` (``"schema": "pagefold-run/1"``), or ``{}``
    if the command left none.
    """
    if isinstance(argv, str):
        raise TypeError("argv is a list of arguments, not a string")
    env = dict(os.environ)
    for key, value in options.items():
        if isinstance(value, bool):
            value = int(value)
        env["PAGEFOLD_" + key.upper()] = str(value)
    with tempfile.TemporaryDirectory(prefix="pagefold-run-") as tmp:
        report = os.path.join(tmp, "report.json")
        done = subprocess.run([binary(), "run", "--json", "--report", report, "--", *argv], env=env)
        try:
            with open(report) as f:
                data = json.load(f)
        except (OSError, ValueError):
            data = {}
    runs = data.get("runs") if isinstance(data, dict) else None
    code = runs[-1].get("exit_code", done.returncode) if runs else done.returncode
    return {"exit_code": code, "report": data}


def doctor() -> Dict[str, Any]:
    """What of pagefold works on this machine for this user, and why:
    ``checks`` (each with ``name``, ``ok``, ``state``, the mechanisms it
    takes away in ``lost`` and the administrator's ``fix``) and
    ``mechanisms`` (``name``, ``works``, the checks it ``missing``). It is
    ``pagefold doctor --json``'s document (``"schema": "pagefold-doctor/1"``)."""
    return json.loads(_call(["doctor", "--json"]))


_STATS_FN: Optional[Any] = None


def engine_stats() -> Dict[str, Any]:
    """What the engine serving this process has done: pages shared by copy,
    zero pages folded, pages merged, frames in use, fallbacks, with
    ``"schema": "pagefold-engine-stats/1"``. Empty when this process does not
    run under pagefold."""
    global _STATS_FN
    if _STATS_FN is None:
        try:
            fn = ctypes.CDLL(None).pagefold_stats_json
        except (AttributeError, OSError):
            return {}
        fn.restype = ctypes.c_size_t
        fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        _STATS_FN = fn
    buf = ctypes.create_string_buffer(1 << 16)
    n = _STATS_FN(buf, len(buf))
    if n == 0 or n >= len(buf):
        return {}
    return json.loads(buf.value[:n].decode())


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext pagefold``: adds the ``%pagefold`` and ``%%pagefold`` magics."""
    from ._magic import register

    register(ipython)
