"""An editable install compiles the hot modules beside their sources (setup.py); after an edit the
older extension would still be what imports, and the suite would test code that no longer exists."""

from __future__ import annotations

from pathlib import Path

from replicator.service.compiled import HOT_MODULES

REPO = Path(__file__).resolve().parents[2]


def stale_extensions() -> list[str]:
    """Compiled modules in the source tree older than their source."""
    stale = []
    for name in HOT_MODULES:
        source = REPO.joinpath(*name.split(".")).with_suffix(".py")
        for extension in source.parent.glob(source.stem + ".*.so"):
            if extension.stat().st_mtime < source.stat().st_mtime:
                stale.append(extension.relative_to(REPO).as_posix())
    return stale
