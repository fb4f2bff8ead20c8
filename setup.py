"""Compiles the data plane's hot modules with mypyc where a C compiler is at hand; see docs/benchmarks.md.

`STREAM_REPLICATOR_COMPILE`: `auto` (the default) compiles when a C compiler and Python's headers
are there and builds pure Python otherwise; `1` insists (the images: a build that silently lost
the compiled path would ship a slower worker); `0` never compiles. Everything else is in
pyproject.toml.
"""

from __future__ import annotations

import os
import shutil
import sysconfig
from pathlib import Path

from setuptools import setup

# The per-message work of a copy: the wire parser, the sampler's skip decision, the ordered
# copier's runs of skips and copies, each copy's subject and header block, and its window entry. All
# stay ordinary Python source as well, which is what runs wherever they are not compiled.
HOT_MODULES = ["replicator/transport/wire.py", "replicator/sampling/limiter.py",
              "replicator/copier/admission.py", "replicator/sampling/state/table.py",
              "replicator/sampling/body.py", "replicator/sampling/keys.py",
              "replicator/copier/transform.py", "replicator/copier/window.py", "replicator/copier/headers.py",
              "replicator/transport/subjects.py"]
SETTING = "STREAM_REPLICATOR_COMPILE"


def can_compile() -> str | None:
    """Why a compiled build is impossible here, or None."""
    compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler})"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        return "no Python headers (Python.h)"
    return None


def extensions() -> list:
    mode = os.environ.get(SETTING, "auto").strip().lower()
    if mode not in {"auto", "0", "1"}:
        raise SystemExit(f"{SETTING} must be auto, 0 or 1, not {mode!r}")
    if mode == "0":
        return []
    problem = can_compile()
    if problem is not None:
        if mode == "1":
            raise SystemExit(f"{SETTING}=1 but {problem}")
        print(f"stream-replicator: building pure Python: {problem}")
        return []
    from mypyc.build import mypycify

    # Blind to installed packages: what mypy would know of them depends on what the environment
    # holds when the build runs, and the same source must always compile to the same code.
    return mypycify(["--no-site-packages", *HOT_MODULES], opt_level="3", group_name="replicator._compiled")


if __name__ == "__main__":  # setuptools runs this file as a script; tests import it for `can_compile`
    setup(ext_modules=extensions())
