"""Source-side loss: sequences the source stream no longer held when the copy reached them.

A limits-retention stream (`max_msgs`, `max_bytes`, `max_age`, `max_msgs_per_subject`) discards its
oldest messages whether a consumer read them or not, and a purge or a message delete removes them on
request. While the replicator is behind (the target down, or the replicator), such messages are gone
before they are copied, and the consumer just delivers the next one: NATS's own sourcing says nothing
(nats-server issue #8612). The copy loops find the range (the stream's first sequence past the resume
point, a delivery that jumps in stream sequence, a consumer that skipped what it never delivered) and
hand it to `LossLedger.lost`: counted by reason in `source_lost_msgs`, logged once, noted in the
durable's metadata (`report` and the operator's status read it there), and published as a `gap`
advisory when advisories are on (`advisory.gaps`).

A jump in stream sequence means loss only when the consumer's filter takes every subject the stream
holds (`covers`); a copy of part of a stream skips the other subjects' sequences by design, and its
losses are not counted (said once in the log at start).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from nats.js.errors import NotFoundError

from replicator.copier.endpoints import Endpoints, GapPublisher
from replicator.copier.removals import Removals
from replicator.observe.metrics import LOSS_REASONS
from replicator.transport.errors import NATS_ERRORS
from replicator.transport.streams import set_consumer_note

log = logging.getLogger(__name__)

LOSS_NOTE = "stream-replicator.loss"  # consumer metadata: the loss so far, JSON (`Note`), for `report`
GAP_SCHEMA_ID = "https://stream-replicator.io/schemas/sr/v1/gap_advisory.json"
STAMP = "%Y-%m-%dT%H:%M:%SZ"


def covers(topic: str, subjects: Iterable[str]) -> bool:
    """Does the filter `topic` take every subject the stream's `subjects` can hold? (A stream with
    no subjects of its own, a mirror or a sourced stream, only when the filter is `>`.)"""
    patterns = list(subjects)
    if not patterns:
        return topic == ">"
    return all(_contains(topic.split("."), s.split(".")) for s in patterns)


def _contains(outer: list[str], inner: list[str]) -> bool:
    """Every subject matching `inner` matches `outer` (both token lists of subject patterns)."""
    for i, token in enumerate(outer):
        if token == ">":
            return len(inner) > i
        if i >= len(inner) or inner[i] == ">":
            return False
        if token != "*" and token != inner[i]:
            return False
    return len(inner) == len(outer)


@dataclass
class Note:
    """What the durable's metadata says about the loss so far: totals and the latest range."""

    lost: int = 0
    by: dict[str, int] = field(default_factory=dict)
    first: int = 0
    last: int = 0
    reason: str = ""
    at: str = ""

    def text(self) -> str:
        return json.dumps({"lost": self.lost, "by": self.by, "first": self.first, "last": self.last,
                           "reason": self.reason, "at": self.at}, separators=(",", ":"))

    @classmethod
    def parse(cls, text: str | None) -> Note | None:
        """The note, or None for none or one this release cannot read."""
        if not text:
            return None
        try:
            raw = json.loads(text)
            return cls(int(raw["lost"]), {str(k): int(v) for k, v in raw["by"].items()}, int(raw["first"]),
                       int(raw["last"]), str(raw["reason"]), str(raw["at"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    def summary(self) -> str:
        """For `report`: `3,299 (limits); last 101..3399 at 2026-11-28T22:40:01Z`."""
        reasons = ", ".join(f"{r} {n:,}" if len(self.by) > 1 else r for r, n in sorted(self.by.items()))
        return f"{self.lost:,} ({reasons}); last {self.first}..{self.last} at {self.at}"


def gap_advisory(*, replicator: str, topic: str, stream: str, identity: str, first: int, last: int,
                 by: dict[str, int], before_ns: int, after_ns: int, now: float) -> dict[str, Any]:
    """The `gap` advisory: the range the centre will never see, and the times either side of it
    (the newest message before it, the oldest after it; null when unknown). `event_id` is derived
    from the stream instance and the range, so every worker and every retry names it the same way."""
    raw = "\x1f".join((replicator, topic, identity, str(first), str(last)))
    return {
        "$schema": GAP_SCHEMA_ID,
        "event_id": hashlib.sha256(raw.encode()).hexdigest()[:32],
        "event": "gap",
        "value": stream,
        "replicator": replicator,
        "topic": topic,
        "stream": stream,
        "first_seq": first,
        "last_seq": last,
        "count": last - first + 1,
        "reasons": by,
        "from": before_ns / 1e9 if before_ns else None,
        "until": after_ns / 1e9 if after_ns else None,
        "timestamp": int(now),
    }


class LossLedger:
    """One worker's account of source-side loss: the counts, the note, the advisories."""

    def __init__(self, ep: Endpoints, removals: Removals | None = None, consumer: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.ep = ep
        self.removals = removals
        self.consumer = consumer or ep.profile.consumer_name
        self.clock = clock
        self.note = Note()
        self.identity = ""  # the source stream instance (`provenance.stream_identity`), for event ids
        self._tasks: set[asyncio.Task[None]] = set()
        self._noting = asyncio.Lock()
        self._said = False  # the log said once that this copy's losses are not counted

    async def start(self) -> None:
        """Listen for the server's word on purges and deletes (`removals.py`)."""
        if self.removals is None:
            self.removals = Removals(self.ep.source_nc, self.ep.source_stream)
            await self.removals.start()

    async def stop(self) -> None:
        await self.drain()
        if self.removals is not None:
            await self.removals.stop()

    async def bind(self, next_seq: int, identity: str) -> tuple[bool, int]:
        """At a (re)bind, before the durable is placed again: carry its earlier note forward, decide
        whether deliveries are accounted (`covers`), and count what the stream discarded past the
        resume point `next_seq` (0: a first start, nothing was promised). Returns (accounted, the
        newest sequence settled: `next_seq` - 1, or the stream's first sequence - 1 past a loss)."""
        ep = self.ep
        self.identity = identity
        with contextlib.suppress(NotFoundError):
            self.restore((await ep.source_js.consumer_info(ep.source_stream, self.consumer)).config.metadata)
        info = await ep.source_js.stream_info(ep.source_stream)
        accounted = covers(ep.profile.settings.topic, info.config.subjects or [])
        if not accounted and not self._said:
            self._said = True
            log.info("%s copies part of stream %s (%s of %s): a jump in stream sequence is not a loss, and "
                     "source-side losses are not counted", ep.worker, ep.source_stream, ep.profile.settings.topic,
                     ", ".join(info.config.subjects or []) or "no subjects of its own")
        first = info.state.first_seq
        if not accounted or not next_seq or first <= next_seq:
            return accounted, max(next_seq - 1, 0)
        after_ns = 0
        with contextlib.suppress(*NATS_ERRORS):
            held = await ep.source_js.get_msg(ep.source_stream, first)
            after_ns = int(held.time.timestamp() * 1e9) if held.time else 0
        self.lost(next_seq, first - 1, 0, after_ns)
        return accounted, first - 1

    def restore(self, metadata: dict[str, str] | None) -> None:
        """Carry the totals of an earlier life of the durable (a restart, a rebind) forward."""
        note = Note.parse((metadata or {}).get(LOSS_NOTE))
        if note is not None and note.lost >= self.note.lost:
            self.note = note
            self.ep.notes[LOSS_NOTE] = note.text()

    def lost(self, first: int, last: int, before_ns: int = 0, after_ns: int = 0) -> None:
        """Source sequences `first`..`last` were gone before they were copied: count, log, note, advise."""
        if last < first:
            return
        count = last - first + 1
        by = self.removals.classify(first, last) if self.removals is not None else {"limits": count}
        m = self.ep.metrics
        for reason, n in by.items():
            if n:
                m.source_lost[reason].inc(n)
        reasons = ", ".join(f"{r} {n}" for r, n in by.items() if n)
        when = (f" (messages from {_stamp(before_ns)} to {_stamp(after_ns)})" if before_ns and after_ns else "")
        log.warning("%s source stream %s no longer holds sequences %d..%d, never copied: %d lost (%s)%s",
                    self.ep.worker, self.ep.source_stream, first, last, count, reasons, when)
        note = self.note
        note.lost += count
        for reason, n in by.items():
            if n:
                note.by[reason] = note.by.get(reason, 0) + n
        note.first, note.last = first, last
        note.reason = max(by, key=lambda r: by[r])
        note.at = dt.datetime.fromtimestamp(self.clock(), dt.UTC).strftime(STAMP)
        self.ep.notes[LOSS_NOTE] = note.text()
        self._spawn(self._write_note())
        advisor = self.ep.advisor
        if advisor is not None:
            self._spawn(self._advise(advisor, gap_advisory(
                replicator=advisor.replicator, topic=self.ep.profile.settings.topic, stream=self.ep.source_stream,
                identity=self.identity, first=first, last=last, by={r: n for r, n in by.items() if n},
                before_ns=before_ns, after_ns=after_ns, now=self.clock())))

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write_note(self) -> None:
        async with self._noting:  # in order: the newest note wins
            try:
                await set_consumer_note(self.ep.source_js, self.ep.source_stream, self.consumer, LOSS_NOTE,
                                        self.note.text())
            except NATS_ERRORS as err:
                log.warning("%s cannot note the source loss on consumer %s: %s (the next bind notes it)",
                            self.ep.worker, self.consumer, err)

    async def _advise(self, advisor: GapPublisher, advisory: dict[str, Any]) -> None:
        if await advisor.publish(advisory):
            self.ep.metrics.advisories_gap.inc()
        else:
            self.ep.metrics.advisories_errors.inc()

    async def drain(self) -> None:
        """Wait for the note and advisories under way (a clean stop)."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5.0)


def _stamp(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns / 1e9, dt.UTC).strftime(STAMP)


__all__ = ["GAP_SCHEMA_ID", "LOSS_NOTE", "LOSS_REASONS", "LossLedger", "Note", "covers", "gap_advisory"]
