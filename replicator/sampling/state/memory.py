"""`limiter_state: memory`: this process only, lost on restart; the base of the other stores."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from replicator.config.model import TopicConfig
from replicator.observe.metrics import WorkerMetrics
from replicator.sampling.state.protocol import Decide, Listener, Observation
from replicator.sampling.state.records import PERSISTED, Sender, resolution, scan_interval, size32
from replicator.sampling.state.table import SenderTable
from replicator.transport.tasks import cancel_and_wait

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- memory store


class MemoryStore:
    """Senders of this process only. Scrubbed of senders not seen for `age` (twice that with
    advisories: there the active advisor forgets them at `age`, after announcing `expire`)."""

    kind = "memory"
    local = True
    skips_from_table = True  # a live sender's skip reads and updates `table` alone (`Limiter`'s fused check)

    def __init__(
        self,
        settings: TopicConfig,
        metrics: WorkerMetrics,
        *,
        clock: Callable[[], float] = time.time,
        table: SenderTable | None = None,
    ) -> None:
        if not settings.age:
            raise ValueError("a limiter state store needs the topic's age")
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self.age = float(settings.age)
        self.advisory_age = settings.advisory_age
        self.resolution = resolution(settings)
        self.interval = scan_interval(settings)
        self.keep_for = self.age * 2 if settings.advisory else self.age
        self.table = table if table is not None else SenderTable()
        # Read at scrape time: setting it on every new sender would cost more than the insert.
        metrics.limiter_seen.set_function(self.table.__len__)
        # Told of new senders and of timed-out ones back (the advisor). Never replaced: while it is
        # empty, the limiter's fused check adds a new sender to `table` itself, without `insert`.
        self.listeners: list[Listener] = []
        self._tasks: list[asyncio.Task[None]] = []

    # -- reading
    def __len__(self) -> int:
        return len(self.table)

    def get(self, key: str) -> Sender | None:
        return self.table.get(key)

    def keys(self) -> list[str]:
        return self.table.keys()

    def add_listener(self, listener: Listener) -> None:
        self.listeners.append(listener)

    def _notify(self, key: str) -> None:
        for listener in self.listeners:
            try:
                listener(key)
            except Exception:  # one listener's bug (logged with its traceback) must not starve the others
                log.exception("state listener failed for %r", key)

    def _worth_a_look(self, s: Sender) -> bool:
        return bool(self.listeners) and (not s.announced or (s.adv > 0 and s.seen > s.adv))

    # -- life cycle
    async def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._maintain(), name=f"{self.kind}-store"))

    async def close(self) -> None:
        await cancel_and_wait(self._tasks)
        self._tasks.clear()

    async def _maintain(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.scrub(self.clock())
            except Exception:  # the maintenance loop outlives a failed scrub (logged with its traceback)
                log.exception("scrubbing the limiter state failed")

    async def scrub(self, now: float) -> int:
        """Forget senders not seen for `keep_for`; yields to the loop every few thousand."""
        removed = 0
        cutoff = now - self.keep_for
        t = self.table
        for n, key in enumerate(t.keys()):
            i = t.slot(key)
            if i is not None and t.seen[i] <= cutoff:
                t.remove(key)
                removed += 1
            if n % 5000 == 4999:
                await asyncio.sleep(0)
        return removed

    # -- the hot path
    def live_slot(self, key: str, now: float) -> int | None:
        """The sender's row if the limiter may decide on it from here, without waiting."""
        i = self.table.index.get(key)
        if i is None or now - self.table.seen[i] >= self.age:
            return None  # new, or forgotten: a new life
        return i

    def touch(self, key: str, i: int, now: float) -> None:
        """A message from a live sender."""
        t = self.table
        if now > t.seen[i]:
            t.seen[i] = now
        if t.adv[i] > 0 and self.listeners:
            self._notify(key)  # timed out before: the advisor owes a `recover`

    def insert(self, key: str, now: float, size: int, src: int = 0) -> int:
        """A new sender (or a new life of a forgotten one), copied now: its row."""
        i = self.table.add(key, now, size, src)
        if self.listeners:
            self._notify(key)
        return i

    def copied_now(self, key: str, i: int, now: float, size: int, src: int = 0) -> None:
        t = self.table
        t.copied[i] = now
        t.size[i] = size32(size)
        t.src[i] = src
        self.touch(key, i, now)

    def claim_ahead(self, key: str, now: float, size: int, decide: Decide, src: int) -> None:
        """Nothing to claim ahead: this process alone decides, at once (see `KVStore`)."""

    def claiming_ahead(self, src: int) -> bool:
        return False

    async def observe(self, key: str, now: float, size: int, decide: Decide, src: int = 0) -> Observation:
        """Record a message from `key` (source sequence `src`) and apply `decide`; atomic per
        sender (no await inside)."""
        i = self.live_slot(key, now)
        if i is None:
            if not decide(None):
                return Observation(False, False)
            self.insert(key, now, size, src)
            return Observation(True, True)
        copy = decide(self.table.sender_at(i))
        if copy:
            self.copied_now(key, i, now, size, src)
        else:
            self.touch(key, i, now)
        return Observation(copy, False)

    # -- the advisor's side
    async def refresh(self, key: str) -> Sender | None:
        return self.table.get(key)

    async def annotate(self, key: str, *, adv: float | None = None, flags: int | None = None) -> bool:
        t = self.table
        i = t.slot(key)
        if i is None:
            return False
        if adv is not None:
            t.adv[i] = adv
        if flags is not None:
            t.flags[i] = (t.flags[i] & ~PERSISTED) | (flags & PERSISTED)
        return True

    async def forget(self, key: str, expected: Sender) -> bool:
        """Remove a sender unless it was seen again (or restarted) since `expected` was read."""
        current = self.table.get(key)
        if current is None:
            return True
        if current.seen != expected.seen or current.first != expected.first:
            return False
        self.table.remove(key)
        return True
