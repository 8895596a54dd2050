"""The IPython magics: ``%pagefold`` prints this kernel's footprint, what a
plain process would use, and the savings by mechanism; ``%%pagefold`` runs
the cell and prints the same before and after."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from . import engine_stats, footprint

PAGE = 4096


def _mib(b: float) -> str:
    return f"{b / (1 << 20):.1f} MiB"


def snapshot() -> Dict[str, Any]:
    """Footprint and engine statistics of this process, now."""
    return {"footprint": footprint(), "engine": engine_stats()}


def rows(s: Dict[str, Any]) -> List[Tuple[str, str]]:
    """The table's rows: footprint, plain estimate, savings by mechanism."""
    fp, st = s["footprint"], s["engine"]
    physical = fp.get("physical_bytes") or 0
    if not st:
        return [("physical footprint", _mib(physical)), ("engine", "not running in this process")]
    sharing = st.get("pages_sharing", 0) * PAGE
    copies = st.get("pages_shared_by_copy", 0) * PAGE
    zeros = st.get("zero_folded", 0) * PAGE
    merged = st.get("merged", 0) * PAGE
    # Memory the engine saves now: pages sharing frames beyond the frames
    # themselves, and evicted pages (their content compressed or on disk).
    saved_now = (st.get("pages_saved_by_sharing", 0) + st.get("evicted_now", 0)) * PAGE
    return [
        ("physical footprint", _mib(physical)),
        ("plain estimate", _mib(physical + saved_now)),
        ("saved now", _mib(saved_now)),
        ("pages sharing a frame", _mib(sharing)),
        ("copies made copy-on-write (total)", _mib(copies)),
        ("zero pages folded (total)", _mib(zeros)),
        ("identical pages merged (total)", _mib(merged)),
    ]


def table(*snaps: Dict[str, Any], heads: Tuple[str, ...] = ("",)) -> str:
    """Plain-text table, one column per snapshot."""
    cols = [rows(s) for s in snaps]
    names = [name for name, _ in cols[0]]
    width = max(len(n) for n in names)
    lines = [" " * width + "".join(f"  {h:>14}" for h in heads)] if any(heads) else []
    for i, name in enumerate(names):
        vals = "".join(f"  {c[i][1] if i < len(c) else '':>14}" for c in cols)
        lines.append(f"{name:<{width}}{vals}")
    return "\n".join(lines)


def register(ipython: Any) -> None:
    from IPython.core.magic import register_line_cell_magic

    @register_line_cell_magic
    def pagefold(line: str, cell: Any = None) -> None:
        if cell is None:
            print(table(snapshot()))
            return
        before = snapshot()
        ipython.run_cell(cell)
        after = snapshot()
        print(table(before, after, heads=("before", "after")))

    del pagefold
