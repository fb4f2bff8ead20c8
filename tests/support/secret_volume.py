"""A Secret volume as kubelet writes it, for rotation tests.

kubelet never rewrites a mounted Secret's files in place: it writes the new generation into a fresh
timestamped directory, points a temporary symlink at it and renames that over `..data` (one atomic
step), then removes the old generation. Each key is a symlink `<key> -> ..data/<key>`, so a reader
that keeps the path sees the new content at once, with another inode and another resolved path.
"""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

_generation = itertools.count(1)


class SecretVolume:
    def __init__(self, root: Path, data: Mapping[str, bytes]) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.update(data)

    def path(self, key: str) -> Path:
        return self.root / key

    def update(self, data: Mapping[str, bytes]) -> None:
        """Swap every key to a new generation at once (keys not given keep their content)."""
        keys = [p for p in self.root.iterdir() if p.is_symlink() and not p.name.startswith("..")]
        current = {p.name: p.read_bytes() for p in keys}
        merged = {**current, **data}
        generation = self.root / f"..gen_{next(_generation):04d}"
        generation.mkdir()
        for key, content in merged.items():
            (generation / key).write_bytes(content)
            (generation / key).chmod(0o600)
        old = os.readlink(self.root / "..data") if (self.root / "..data").is_symlink() else None
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(generation.name)
        os.replace(tmp, self.root / "..data")
        for key in merged:
            link = self.root / key
            if not link.is_symlink():
                link.symlink_to(Path("..data") / key)
        if old is not None:
            shutil.rmtree(self.root / old)
