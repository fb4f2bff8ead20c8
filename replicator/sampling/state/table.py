"""The sender table: parallel array columns behind one dict, about 200 bytes per sender."""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import Any

from replicator.sampling.state.records import PERSISTED, Sender, size32

GROWTH = 16  # columns grow by 1/16 of their rows (at least MIN_GROWTH), like array's own appends
MIN_GROWTH = 256


class SenderTable:
    """Senders as parallel columns; a dict maps each value to its row. Freed rows are reused.

    Columns are grown ahead in zeroed blocks, so a new sender's row is a few stores into rows
    that already exist: with a fleet where every sender is new, six appends a sender cost more
    than the sampling decision itself. Rows past `rows` are spare and always zero.
    """

    def __init__(self, extra: Iterable[tuple[str, str]] = ()) -> None:
        self.index: dict[str, int] = {}
        self.rows = 0  # rows in use or freed; the columns may be longer
        self._free = array("q")
        self.first: array[float] = array("d")
        self.seen: array[float] = array("d")
        self.copied: array[float] = array("d")
        self.adv: array[float] = array("d")
        self.size: array[int] = array("I")
        self.flags: array[int] = array("B")
        self.src: array[int] = array("Q")
        self._columns: dict[str, array[Any]] = {
            "first": self.first,
            "seen": self.seen,
            "copied": self.copied,
            "adv": self.adv,
            "size": self.size,
            "flags": self.flags,
            "src": self.src,
        }
        for name, code in extra:
            self._columns[name] = array(code)

    def column(self, name: str) -> array[Any]:
        return self._columns[name]

    def __len__(self) -> int:
        return len(self.index)

    def __contains__(self, key: object) -> bool:
        return key in self.index

    def slot(self, key: str) -> int | None:
        return self.index.get(key)

    def sender_at(self, i: int) -> Sender:
        return Sender(self.first[i], self.seen[i], self.copied[i], self.size[i], self.adv[i], self.flags[i],
                      self.src[i])

    def get(self, key: str) -> Sender | None:
        i = self.index.get(key)
        return None if i is None else self.sender_at(i)

    def set(self, i: int, s: Sender, *, keep_flags: int = 0) -> None:
        self.first[i] = s.first
        self.seen[i] = s.seen
        self.copied[i] = s.copied
        self.adv[i] = s.adv
        self.size[i] = size32(s.size)
        self.flags[i] = (s.flags & 0xFF & ~keep_flags) | (self.flags[i] & keep_flags)
        self.src[i] = s.src

    def put(self, key: str, s: Sender) -> int:
        """Insert or overwrite; extra columns of a new row start at 0."""
        i = self.index.get(key)
        if i is None:
            if self._free:
                i = self._free.pop()
                for col in self._columns.values():
                    col[i] = 0
            else:
                i = self._new_row()
            self.index[key] = i
        self.set(i, s)
        return i

    def add(self, key: str, now: float, size: int, src: int = 0) -> int:
        """A new sender first seen and copied `now` (claimed by source sequence `src`): `put`
        without building a Sender (hot path)."""
        index = self.index
        if self._free or key in index:
            return self.put(key, Sender(first=now, seen=now, copied=now, size=size, src=src))
        i = self._new_row()
        self.first[i] = now  # adv, flags and the extra columns of a spare row are already 0
        self.seen[i] = now
        self.copied[i] = now
        self.size[i] = size if 0 <= size <= 0xFFFFFFFF else size32(size)
        if src:
            self.src[i] = src
        index[key] = i
        return i

    def _new_row(self) -> int:
        i = self.rows
        if i == len(self.first):
            self._grow()
        self.rows = i + 1
        return i

    def _grow(self) -> None:
        more = max(MIN_GROWTH, self.rows // GROWTH)
        for col in self._columns.values():
            col.frombytes(bytes(more * col.itemsize))

    def remove(self, key: str) -> bool:
        i = self.index.pop(key, None)
        if i is None:
            return False
        self._free.append(i)
        return True

    def keys(self) -> list[str]:
        return list(self.index)

    def snapshot(self) -> dict[str, list[float | int]]:
        """Rows as `value: [first, seen, copied, size, adv, flags, src]`, the state file's layout."""
        f, s, c, z, a, g, r = self.first, self.seen, self.copied, self.size, self.adv, self.flags, self.src
        return {k: [f[i], s[i], c[i], z[i], a[i], g[i] & PERSISTED, r[i]] for k, i in self.index.items()}
