"""What the limiter and the advisor need from a state store, whichever kind it is."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from replicator.sampling.state.records import Sender
from replicator.sampling.state.table import SenderTable


@dataclass(frozen=True, slots=True)
class Observation:
    copy: bool
    new: bool


Decide = Callable[[Sender | None], bool]
"""The limiter's rule, given the sender's live record (None: new or forgotten, must return True)."""
Listener = Callable[[str], None]
"""Called with a sender the advisor may need to look at (new, or back after a timeout)."""


class StateStore(Protocol):
    """What the limiter and the advisor need from a store. One instance per process."""

    kind: str
    resolution: float
    table: SenderTable
    local: bool
    """True: only this process decides, so `insert` and `copied_now` may record copies at once;
    False (KV): copies are claimed through `observe`."""
    listeners: list[Listener]
    skips_from_table: bool
    """True: a message from a live sender that is not due is skipped by reading `table` and
    updating its `seen` alone, with no `live_slot` or `touch` (the limiter fuses that path)."""

    def __len__(self) -> int: ...
    def live_slot(self, key: str, now: float) -> int | None: ...
    def touch(self, key: str, i: int, now: float) -> None: ...
    def insert(self, key: str, now: float, size: int, src: int = 0) -> int: ...
    def copied_now(self, key: str, i: int, now: float, size: int, src: int = 0) -> None: ...
    def get(self, key: str) -> Sender | None: ...
    def keys(self) -> list[str]: ...
    def add_listener(self, listener: Listener) -> None: ...
    def claim_ahead(self, key: str, now: float, size: int, decide: Decide, src: int) -> None: ...
    def claiming_ahead(self, src: int) -> bool: ...
    async def observe(self, key: str, now: float, size: int, decide: Decide, src: int = 0) -> Observation: ...
    async def refresh(self, key: str) -> Sender | None: ...
    async def annotate(self, key: str, *, adv: float | None = None, flags: int | None = None) -> bool: ...
    async def forget(self, key: str, expected: Sender) -> bool: ...
    async def start(self) -> None: ...
    async def close(self) -> None: ...
