"""What the source server says was removed on request: purges and message deletes of our stream.

Every JetStream API call in an account is announced on `$JS.EVENT.ADVISORY.API` (the API audit
advisory, with the request and the response). A worker listens there on its source connection and
remembers, for its source stream, up to which sequence a purge removed messages and which sequences
were deleted one by one, so that a lost range (`loss.py`) is split into `purge`, `delete` and, for
the rest, `limits`. A removal made while no worker listened (the replicator down, an account that may
not subscribe to the advisory) is counted as `limits`: the server said nothing we heard.
"""

from __future__ import annotations

import json
import logging
from collections import deque

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from replicator.transport.errors import NATS_ERRORS

log = logging.getLogger(__name__)

AUDIT = "$JS.EVENT.ADVISORY.API"
MAX_DELETES = 100_000  # single deletes remembered (the oldest forgotten first)


class Removals:
    """Purges and deletes of one stream, as the server's audit advisories announced them."""

    def __init__(self, nc: Client, stream: str) -> None:
        self.nc = nc
        self.stream = stream
        self.purged_through = 0  # every sequence up to this one was purged (0: no purge heard)
        self.filtered_purges: list[tuple[int, int]] = []  # (from, through): a purge of some subjects
        self.deleted: set[int] = set()
        self._order: deque[int] = deque()
        self._sub: Subscription | None = None
        self._purge = f".STREAM.PURGE.{stream}".encode()
        self._delete = f".STREAM.MSG.DELETE.{stream}".encode()

    async def start(self) -> None:
        try:
            self._sub = await self.nc.subscribe(AUDIT, cb=self._on_advisory)
        except NATS_ERRORS as err:
            log.info("cannot listen for %s (%s): every source loss is counted as limits", AUDIT, err)

    async def stop(self) -> None:
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except NATS_ERRORS as err:
                log.debug("unsubscribing from %s: %s", AUDIT, err)
            self._sub = None

    async def _on_advisory(self, msg: Msg) -> None:
        data = msg.data
        purge = self._purge in data
        if not purge and self._delete not in data:
            return  # most API calls: decided without decoding the JSON
        try:
            doc = json.loads(data)
            subject = str(doc.get("subject", ""))
            response = json.loads(doc.get("response") or "{}")
            request = json.loads(doc.get("request") or "{}") if doc.get("request") else {}
        except (ValueError, TypeError, AttributeError):
            return
        if response.get("error") or not response.get("success", False):
            return
        if purge and subject.endswith(self._purge.decode()):
            await self._purged(request)
        elif subject.endswith(self._delete.decode()) and isinstance(request.get("seq"), int):
            self._note_delete(request["seq"])

    async def _purged(self, request: dict[str, object]) -> None:
        """The range a purge removed: up to `seq` - 1 when it names one, else up to the stream's
        first sequence now (a whole purge) or its last (`keep` or `filter`: some of them)."""
        try:
            state = (await self.nc.jetstream().stream_info(self.stream)).state
        except NATS_ERRORS as err:
            log.info("a purge of %s was announced but its range cannot be read (%s): counted as limits",
                     self.stream, err)
            return
        seq = request.get("seq")
        if request.get("filter") or request.get("keep"):
            through = seq - 1 if isinstance(seq, int) and seq > 0 else state.last_seq
            self.filtered_purges.append((1, through))
            del self.filtered_purges[:-100]
            return
        through = seq - 1 if isinstance(seq, int) and seq > 0 else state.first_seq - 1
        self.purged_through = max(self.purged_through, through)

    def _note_delete(self, seq: int) -> None:
        if seq in self.deleted:
            return
        self.deleted.add(seq)
        self._order.append(seq)
        if len(self._order) > MAX_DELETES:
            self.deleted.discard(self._order.popleft())

    def classify(self, first: int, last: int) -> dict[str, int]:
        """How many of `first`..`last` were deleted, purged, and (the rest) discarded by limits."""
        deleted = sum(1 for s in self.deleted if first <= s <= last) if self.deleted else 0
        through = max([self.purged_through, *(t for f, t in self.filtered_purges if f <= first)])
        purged = max(0, min(last, through) - first + 1)
        if purged and deleted:
            purged -= sum(1 for s in self.deleted if first <= s <= min(last, through))
        limits = last - first + 1 - deleted - purged
        return {"limits": limits, "purge": purged, "delete": deleted}
