"""Which of the data plane's hot modules run compiled: `setup.py` builds them with mypyc where a C
compiler is at hand, and a build without one ships the same modules as plain Python. The log says
which, so a slow worker built without a compiler is told apart from a slow broker."""

from __future__ import annotations

import importlib

# The modules `setup.py` compiles (HOT_MODULES there, as paths; a test keeps the two lists equal).
HOT_MODULES = ("replicator.transport.wire", "replicator.sampling.limiter", "replicator.copier.admission",
               "replicator.sampling.state.table", "replicator.sampling.body", "replicator.sampling.keys",
               "replicator.copier.transform", "replicator.copier.window", "replicator.copier.headers",
               "replicator.transport.subjects")


def compiled_modules() -> list[str]:
    """The hot modules this process imported as compiled extensions."""
    return [name for name in HOT_MODULES if not (importlib.import_module(name).__file__ or "").endswith(".py")]


def describe() -> str:
    compiled = compiled_modules()
    if not compiled:
        return "data path interpreted (a pure-Python build: setup.py compiles it where a C compiler is at hand)"
    names = ", ".join(name.rsplit(".", 1)[1] for name in compiled)
    return f"data path compiled (mypyc): {names}"
