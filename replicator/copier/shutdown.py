"""Ordered mode's clean stop: what is in flight is finished and acknowledged (bounded in time),
then the durable is left exactly at the copy position, so the next start needs no search of the
target."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from typing import Protocol

from replicator.copier import durable
from replicator.copier.batching import BatchWriter
from replicator.copier.control import wait_wake
from replicator.copier.endpoints import PUBLISH_TIMEOUT, Endpoints
from replicator.copier.window import Entry
from replicator.transport.jetstream import Puller


class Stopping(Protocol):
    """What the clean stop uses of the ordered copier."""

    ep: Endpoints
    puller: Puller | None
    window: deque[Entry]
    chain_open: bool
    writer: BatchWriter
    wake: asyncio.Event
    committed: int

    @property
    def max_in_flight(self) -> int: ...
    async def drain(self) -> None: ...
    async def pump(self) -> None: ...
    async def restart_chain(self) -> None: ...


async def finish(copier: Stopping) -> None:
    deadline = time.monotonic() + PUBLISH_TIMEOUT * 2
    if copier.puller is not None:
        copier.puller.buffer.clear()
    await copier.drain()  # skips admitted last are acked here even with an empty window
    while copier.window and time.monotonic() < deadline:
        if not copier.chain_open:
            await copier.restart_chain()
        await copier.pump()
        await copier.writer.commit_now()  # its PubAck confirms the batch's tail
        pending = [e.future for e in copier.window if e.future is not None and not e.future.done()]
        batch = copier.writer.batch
        in_batch = batch is not None and not batch.ended and batch.unconfirmed > 0
        if pending:
            await asyncio.wait(pending, timeout=1.0)
        elif in_batch:
            await wait_wake(copier.wake, 0.2)
            await copier.writer.tick(idle=True)  # a silent batch fails (and is recovered) here
        before = len(copier.window)
        await copier.drain()
        if len(copier.window) == before and not pending and not in_batch:
            break
    with contextlib.suppress(Exception):
        await copier.ep.source_nc.flush(timeout=2)
    if not copier.window and copier.committed:
        with contextlib.suppress(Exception):
            await durable.park(copier.ep, copier.committed, copier.max_in_flight, copier.writer.path)
