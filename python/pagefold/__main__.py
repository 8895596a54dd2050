"""``python -m pagefold ...``: the ``pagefold`` command, plus
``python -m pagefold kernel install`` for Jupyter.

Every other argument list goes to the ``pagefold`` binary unchanged, which
replaces this process (so exit codes and signals are the command's own).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from . import PagefoldError, binary


def _kernel(args: List[str]) -> int:
    from .kernel import install

    ap = argparse.ArgumentParser(prog="python -m pagefold kernel")
    sub = ap.add_subparsers(dest="what", required=True)
    inst = sub.add_parser("install", help="register a Jupyter kernel that runs under pagefold")
    inst.add_argument("--user", action="store_true", help="install for this user only")
    inst.add_argument("--name", default="pagefold", help="kernel name (default: pagefold)")
    inst.add_argument("--display-name", default=None, help='shown in Jupyter (default: "Python 3 (pagefold)")')
    inst.add_argument("--prefix", default=None, help="install under PREFIX/share/jupyter/kernels")
    ns = ap.parse_args(args)
    try:
        path = install(name=ns.name, user=ns.user, prefix=ns.prefix, display_name=ns.display_name)
    except (PagefoldError, ImportError, OSError) as e:
        print(f"pagefold: {e}", file=sys.stderr)
        return 1
    print(f"installed kernel {ns.name} in {path}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["kernel"]:
        return _kernel(args[1:])
    try:
        exe = binary()
    except PagefoldError as e:
        print(f"pagefold: {e}", file=sys.stderr)
        return 1
    os.execv(exe, [exe, *args])
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
