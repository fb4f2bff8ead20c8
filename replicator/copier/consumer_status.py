"""Ordered mode's answer to the consumer statuses that end its durable: deleted, leadership lost, gone.

The durable is placed again where the copier is; when the source stream itself was deleted and created
again (its identity changed), the window is dropped and the new stream is copied from the start
position: its sequences are another stream's.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Protocol

from replicator.copier.batching import BatchWriter
from replicator.copier.control import Backoff, Stopper
from replicator.copier.endpoints import Endpoints, source_identity
from replicator.copier.transform import MessageTransform
from replicator.copier.window import Entry
from replicator.transport.jetstream import Publisher, Puller

log = logging.getLogger("replicator.copier.ordered")


class Rebinding(Protocol):
    """What the answer to a consumer status uses of the ordered copier."""

    ep: Endpoints
    stopper: Stopper
    backoff: Backoff
    transform: MessageTransform
    publisher: Publisher
    writer: BatchWriter
    puller: Puller | None
    window: deque[Entry]
    unsent: deque[Entry]
    ack_due: str | None

    async def bind(self) -> None: ...
    async def _rebind(self, *, delete: bool) -> None: ...
    def _reset_window(self) -> None: ...


async def consumer_trouble(self: Rebinding, status: int, text: str) -> bool:
    """409s: the consumer was deleted or lost leadership; 503: it is gone. Rebind where we are,
    or from the start position when the source stream was deleted and created again. False
    for any other status (the copy goes on: a `continue` per status could starve it)."""
    ep = self.ep
    gone = status == 503 or "deleted" in text.lower()
    if not gone and not (status == 409 and "leadership" in text.lower()):
        log.warning("%s consumer status %d %s", ep.worker, status, text)
        return False
    try:
        identity = await source_identity(self.ep)
    except Exception as err:  # whatever kept the stream from being read: the loop retries after a backoff
        log.warning("%s source stream %s unavailable (%s): retrying", ep.worker, ep.source_stream, err)
        await self.stopper.sleep(self.backoff.next())
        return True
    if identity == self.transform.writer.identity:
        log.warning("%s consumer status %d %s", ep.worker, status, text)
        await self._rebind(delete=False)
        return True
    log.warning("%s source stream %s was deleted and created again: copying the new stream from its "
                "start position", ep.worker, ep.source_stream)
    self.publisher.forget_all()
    self.writer.abandon()
    self._reset_window()
    self.window.clear()
    self.unsent.clear()
    self.ack_due = None
    try:
        await self.bind()
        assert self.puller is not None
        await self.puller.restart()
    except Exception as err:  # as above: a failed bind is retried, the copy loop must go on
        log.warning("%s cannot bind consumer: %s", ep.worker, err)
        await self.stopper.sleep(self.backoff.next())
    return True

