"""Ordered mode's window: the messages on their way to the target, in source order, and what is
known about each (answered, confirmed by a batch, or uncertain)."""

from __future__ import annotations

import asyncio
import time
from collections import deque

from replicator.copier.batching import State, state
from replicator.copier.failures import uncertain
from replicator.copier.transform import Copy
from replicator.transport.fastbatch import FastBatch
from replicator.transport.jetstream import PublishError
from replicator.transport.wire import RawMsg


class Entry:
    """One message in the ordered window, on its way to the target, and the skipped (sampled out,
    too old) deliveries behind it: they are done when it is, and need no entry of their own.

    A plain class, not a dataclass: this module is compiled, and a compiled dataclass keeps the
    interpreted `__init__` the dataclass machinery writes, one per copied message."""

    __slots__ = ("attempts", "batch", "bseq", "copy", "future", "msg", "received", "sent_at", "seq",
                 "skipped_reply", "skipped_seq", "ts")

    def __init__(self, msg: RawMsg, seq: int, ts: int, received: float, copy: Copy) -> None:
        self.msg = msg
        self.seq = seq
        self.ts = ts  # source timestamp, ns
        self.received = received
        self.copy = copy
        self.future: asyncio.Future[bytes] | None = None  # its PubAck, when published on its own
        self.sent_at = 0.0
        self.attempts = 0
        self.skipped_seq = 0
        self.skipped_reply = ""
        self.batch: FastBatch | None = None  # or sent in this fast-ingest batch, as message `bseq`
        self.bseq = 0

    @property
    def last_seq(self) -> int:
        return self.skipped_seq or self.seq

    @property
    def last_reply(self) -> str:
        return self.skipped_reply or self.msg.reply

    @property
    def sent(self) -> bool:
        return self.future is not None or self.batch is not None


def take_sendable(unsent: deque[Entry], room: int, near_limit: int, predecessor: bytes | None,
                  chained: bool) -> tuple[list[Entry], list[tuple[str, bytes, bytes]], bytes | None]:
    """Up to `room` copies off the front of the unsent queue for one batch write, each chained to
    the one before it (when `chained`): the entries, their (subject, header block, payload), and
    the last one's msg id. It stops at a copy that must not be chained or that with the chain
    line could exceed the server's `near_limit` (those go alone)."""
    taken: list[Entry] = []
    messages: list[tuple[str, bytes, bytes]] = []
    while room > len(taken) and unsent:
        copy = unsent[0].copy
        if not copy.chainable or len(copy.head) + len(copy.payload) > near_limit:
            break
        taken.append(unsent.popleft())
        messages.append((copy.subject, copy.block(predecessor if chained else None), copy.payload))
        predecessor = copy.msg_id
    return taken, messages, predecessor


def sent_in(taken: list[Entry], batch: FastBatch, first: int) -> None:
    """`taken` went out in `batch` as its messages `first`, `first` + 1, ..."""
    now = time.monotonic()
    for i, entry in enumerate(taken):
        entry.batch, entry.bseq, entry.sent_at = batch, first + i, now
        entry.attempts += 1


def landed(entry: Entry) -> bool:
    """Confirmed stored on the target (its PubAck, or its batch's flow ack or commit)."""
    if entry.batch is not None:
        return state(entry.batch, entry.bseq) is State.LANDED
    fut = entry.future
    return fut is not None and fut.done() and not fut.cancelled() and fut.exception() is None


def any_unsure(window: deque[Entry]) -> bool:
    """Did any publish in the window end without an answer (it may have landed)?"""
    for e in window:
        if e.batch is not None:
            if state(e.batch, e.bseq) in (State.PENDING, State.UNKNOWN):
                return True
            continue
        fut = e.future
        if fut is None:
            continue
        if not fut.done() or fut.cancelled():
            return True
        exc = fut.exception()
        if exc is not None and (not isinstance(exc, PublishError) or uncertain(exc)):
            return True
    return False


def reset(window: deque[Entry]) -> deque[Entry]:
    """Forget how the window's messages were sent (they will be sent again); the new unsent queue."""
    for e in window:
        settled(e.future)
        e.future, e.batch, e.bseq = None, None, 0
    return deque(window)


def batch_failure(window: deque[Entry], batch: FastBatch, head: Entry) -> tuple[Entry, PublishError]:
    """The entry a batch's failure names (the window's head when it names none) and the error."""
    assert batch.error is not None
    named = next((e for e in window if e.batch is batch and e.bseq == batch.error_seq), head)
    return named, batch.error


def settled(fut: asyncio.Future[bytes] | None) -> None:
    """Drop a publish future we no longer wait for, reading its error first: an unread one makes
    asyncio log "Future exception was never retrieved" with a traceback, once per message."""
    if fut is not None and fut.done() and not fut.cancelled():
        fut.exception()
