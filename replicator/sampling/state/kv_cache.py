"""The local cache of a `limiter_state: kv` bucket: fed by a watch of every process's writes,
merged with what only this process knows yet (later sightings, decisions made while the KV was
unreachable). `KVStore` claims and writes through it."""

from __future__ import annotations

import asyncio
import logging
import time
from array import array
from collections.abc import Callable
from typing import TYPE_CHECKING

from msgspec.structs import replace

from replicator.config.model import TopicConfig
from replicator.observe.metrics import WorkerMetrics
from replicator.sampling.state.kv_bucket import deleted
from replicator.sampling.state.memory import MemoryStore
from replicator.sampling.state.records import ANNOUNCED, Sender, decode_key, decode_sender
from replicator.sampling.state.table import SenderTable
from replicator.transport.ordered_watch import OrderedWatch

if TYPE_CHECKING:
    from nats.js import JetStreamContext

log = logging.getLogger(__name__)

LOCAL_NEWER = 0x40  # kv cache only: this process saw the sender after the KV's last-seen time
DIRTY = 0x80  # kv cache only: a copy decided here while the KV was unreachable, not written yet


class KVCache(MemoryStore):
    """The senders of a KV bucket as this process knows them, with each one's KV revision."""

    def __init__(
        self,
        js: JetStreamContext,
        bucket: str,
        settings: TopicConfig,
        metrics: WorkerMetrics,
        *,
        clock: Callable[[], float] = time.time,
        op_timeout: float,
    ) -> None:
        table = SenderTable(extra=(("rev", "Q"), ("kv_seen", "d")))
        super().__init__(settings, metrics, clock=clock, table=table)
        self.js = js
        self.bucket = bucket
        self.stream = f"KV_{bucket}"
        self.prefix = f"$KV.{bucket}."
        self.op_timeout = op_timeout
        self.rev: array[int] = self.table.column("rev")
        self.kv_seen: array[float] = self.table.column("kv_seen")
        # Seen refreshes only matter to the advisor (`KVStore._due_refreshes`).
        self.refresh_seen = settings.advisory is not None
        self._sub: OrderedWatch | None = None
        self._last_seq = 0
        self._loaded = asyncio.Event()
        self._dirty: set[str] = set()  # decisions the KV has not seen
        self._urgent: set[str] = set()  # sightings the leader must hear of now
        self._wake = asyncio.Event()

    @property
    def loaded(self) -> bool:
        return self._loaded.is_set()

    # -- the watch: every process's writes reach every cache
    async def _watch(self, from_seq: int | None) -> None:
        """Watch the bucket from the last entry of each key (None: loading it), or from `from_seq`."""
        await self._unwatch()
        if from_seq is None:
            self._loaded.clear()
        watch = OrderedWatch(self.js._nc, self.js, self.stream, self.prefix + ">", self._on_entry,
                             timeout=self.op_timeout * 2)
        self._sub = watch
        if await watch.start(from_seq):
            self._loaded.set()

    async def _unwatch(self) -> None:
        watch, self._sub = self._sub, None
        if watch is not None:
            await watch.stop()

    def _on_entry(self, subject: str, hdr: bytes | None, data: bytes, seq: int, pending: int) -> None:
        """Every write of every process, ours included, as the bucket stored it."""
        try:
            if seq > self._last_seq:
                self._last_seq = seq
            key = decode_key(subject[len(self.prefix) :])
            i = self.table.index.get(key)
            if i is None or seq > self.rev[i]:  # not our own write coming back
                if hdr is not None and deleted(hdr):
                    if i is not None:
                        self._drop(key)
                else:
                    self._apply_remote(key, decode_sender(data), seq)
            if not pending:
                self._loaded.set()
        except (ValueError, KeyError, TypeError) as err:
            log.warning("ignoring a KV state entry on %s: %s", subject, err)

    def _apply_remote(self, key: str, rec: Sender, rev: int) -> None:
        """Take a KV revision into the cache, keeping what only this process knows yet."""
        t = self.table
        i = t.index.get(key)
        if i is None:
            i = t.put(key, rec)
            self.rev[i] = rev
            self.kv_seen[i] = rec.seen
            if self.listeners and self._loaded.is_set() and self._worth_a_look(rec):
                self._notify(key)
            return
        if rev <= self.rev[i]:
            return
        local_seen, local_copied, local_size, local_src = t.seen[i], t.copied[i], t.size[i], t.src[i]
        dirty = t.flags[i] & DIRTY
        t.set(i, rec, keep_flags=LOCAL_NEWER | DIRTY)
        self.rev[i] = rev
        self.kv_seen[i] = rec.seen
        if local_seen > rec.seen:
            t.seen[i] = local_seen
        else:
            t.flags[i] &= ~LOCAL_NEWER
        if dirty and local_copied > rec.copied:
            t.copied[i] = local_copied
            t.size[i] = local_size
            t.src[i] = local_src
        # `_worth_a_look` of the merged row, read from the columns rather than a Sender built for it.
        if self.listeners and self._loaded.is_set() and (
                not t.flags[i] & ANNOUNCED or (t.adv[i] > 0 and t.seen[i] > t.adv[i])):
            self._notify(key)

    def _drop(self, key: str) -> None:
        self.table.remove(key)
        self._dirty.discard(key)
        self._urgent.discard(key)

    def _cached(self, key: str) -> tuple[Sender | None, int]:
        i = self.table.slot(key)
        if i is None:
            return None, 0
        return self.table.sender_at(i), self.rev[i]

    def _tombstone(self, key: str, seq: int) -> tuple[Sender | None, int]:
        """The KV holds no live entry: drop ours, unless it is a decision still to be written."""
        i = self.table.slot(key)
        if i is None:
            return None, seq
        if self.table.flags[i] & DIRTY:
            self.rev[i] = seq
            return self.table.sender_at(i), seq
        self._drop(key)
        return None, seq

    # -- the cache's own changes
    def touch(self, key: str, i: int, now: float) -> None:
        """A skipped message: only the cache changes (the KV hears of it later, if it must)."""
        t = self.table
        if now > t.seen[i]:
            t.seen[i] = now
            if self.refresh_seen and now > self.kv_seen[i]:
                t.flags[i] |= LOCAL_NEWER
        if t.adv[i] > 0 and self.refresh_seen:
            self._urgent.add(key)  # the leader owes a `recover`: tell it now
            self._wake.set()
            self._notify(key)

    def _record_locally(self, key: str, current: Sender | None, now: float, size: int, src: int) -> None:
        """A copy decided without the KV: remembered here, written back when it answers."""
        if current is None:
            i = self.insert(key, now, size, src)
        else:
            i = self.table.put(key, replace(current, seen=max(current.seen, now), copied=now, size=size, src=src))
        self.table.flags[i] |= DIRTY
        self._dirty.add(key)

    def _written(self, key: str, record: Sender, rev: int) -> None:
        """Our write landed as `rev`: the cache takes it, keeping any later local sighting."""
        t = self.table
        i = t.slot(key)
        local_seen = t.seen[i] if i is not None else 0.0
        i = t.put(key, record)
        flags = t.flags[i] & ~(DIRTY | LOCAL_NEWER)
        if local_seen > record.seen:
            t.seen[i] = local_seen
            if self.refresh_seen:
                flags |= LOCAL_NEWER
        t.flags[i] = flags
        self.rev[i] = rev
        self.kv_seen[i] = record.seen
        self._dirty.discard(key)

    def _rewrite_all(self) -> None:
        """The bucket lost its history: every cached sender is a decision to write back, against
        the new bucket's revisions (none yet)."""
        t = self.table
        for i in t.index.values():
            self.rev[i] = 0
            t.flags[i] |= DIRTY
        self._dirty = set(t.index)

    async def scrub(self, now: float) -> int:
        removed = await super().scrub(now)
        if removed:
            self._dirty.intersection_update(self.table.index)
            self._urgent.intersection_update(self.table.index)
        return removed
