"""A Jupyter kernel that runs under pagefold: an ipykernel whose process has
the preload library loaded (``LD_PRELOAD`` in the kernel spec's environment),
so the notebook's arrays and data frames go through the engine."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Optional

from . import preload_path


def spec(display_name: Optional[str] = None) -> dict:
    """The kernel spec: this Python's ipykernel with the preload loaded."""
    return {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": display_name or "Python 3 (pagefold)",
        "language": "python",
        "env": {"LD_PRELOAD": preload_path()},
        "metadata": {"debugger": True},
    }


def install(name: str = "pagefold", user: bool = False, prefix: Optional[str] = None,
            display_name: Optional[str] = None) -> str:
    """Installs the kernel spec; returns the directory it went to."""
    try:
        from jupyter_client.kernelspec import KernelSpecManager
    except ImportError as e:
        raise ImportError("the Jupyter kernel needs ipykernel and jupyter_client: "
                          "pip install 'pagefold[jupyter]' (in a checkout: pip install '.[jupyter]')") from e

    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "kernel.json"), "w") as f:
            json.dump(spec(display_name), f, indent=1)
        return KernelSpecManager().install_kernel_spec(d, kernel_name=name, user=user, prefix=prefix)
