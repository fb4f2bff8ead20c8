"""Source-side loss in scaled mode, where no single worker sees the consumer's whole sequence.

The workers of a process share one `GroupLoss`. Two ways a message is lost there:

- *never delivered*: the stream discarded it before the group's durable reached it, and the durable
  jumped over it. The durable numbers its deliveries (the consumer sequence) and delivers new
  messages in stream order, so the first deliveries, put back in consumer order, show the jump: two
  consecutive ones whose stream sequences are not consecutive (`saw`).
- *delivered, not copied, not redelivered*: a publish failed, the message was nak'ed for a later
  redelivery, and the stream discarded it meanwhile; the server then drops the redelivery silently.
  A nak'ed sequence that the stream no longer holds and that did not come back is lost (`check`).

Both are exact while one process holds the group's workers. With several pods, a delivery that went
to another pod leaves a hole in this one's consumer order: the jump across it is not judged (the
other pod judges its own), and a message nak'ed here and copied there before the stream discarded it
would be counted here; `docs/reliability.md` says so.
"""

from __future__ import annotations

import logging
import time

from nats.js.api import ConsumerInfo

from replicator.copier.loss import LossLedger, covers
from replicator.transport.errors import NATS_ERRORS

log = logging.getLogger(__name__)

HOLE_WAIT = 5.0  # seconds a missing consumer sequence is waited for before it is taken as another pod's
MAX_HELD = 50_000  # deliveries held out of order at most (then the oldest hole is given up)


class GroupLoss:
    """The process's view of the group durable's deliveries, in consumer order, and its nak'ed ones."""

    def __init__(self, ledger: LossLedger) -> None:
        self.ledger = ledger
        self.account = False
        self.cursor = 0  # the next consumer sequence to put in order (0: not bound yet)
        self.last_first = 0  # stream sequence of the last first delivery put in order (0: unknown)
        self.last_ts = 0
        self.held: dict[int, tuple[int, bool, int]] = {}  # consumer seq -> (stream seq, first?, ts ns)
        self.hole_since = 0.0
        self.awaiting: dict[int, int] = {}  # nak'ed stream seq -> its timestamp (ns)
        self.suspects: set[int] = set()  # nak'ed, gone from the stream at the last check
        self.checked = 0.0

    async def start(self) -> None:
        ep = self.ledger.ep
        await self.ledger.start()
        info = await ep.source_js.stream_info(ep.source_stream)
        self.account = covers(ep.profile.settings.topic, info.config.subjects or [])
        with_note = await _metadata(self.ledger)
        self.ledger.restore(with_note)

    def bound(self, info: ConsumerInfo, identity: str) -> None:
        """A worker bound the durable: a new durable (or the first bind) starts the order afresh."""
        self.ledger.identity = identity
        delivered = info.delivered
        cseq = delivered.consumer_seq or 0 if delivered else 0
        if self.cursor and cseq + 1 >= self.cursor:
            return
        self.cursor = cseq + 1
        self.last_first = delivered.stream_seq or 0 if delivered and cseq else 0
        self.held.clear()

    def saw(self, cseq: int, seq: int, delivered: int, ts: int) -> None:
        """A delivery, as a worker took it (any order across workers)."""
        if delivered > 1:
            self.awaiting.pop(seq, None)
            self.suspects.discard(seq)
        if not self.account or not self.cursor:
            return
        if cseq < self.cursor:
            return  # a late one of a hole given up
        self.held[cseq] = (seq, delivered == 1, ts)
        self._advance()

    def _advance(self) -> None:
        held = self.held
        while self.cursor in held:
            seq, first, ts = held.pop(self.cursor)
            self.cursor += 1
            if not first:
                continue
            if self.last_first and seq > self.last_first + 1:
                self.ledger.lost(self.last_first + 1, seq - 1, self.last_ts, ts)
            if seq > self.last_first:
                self.last_first, self.last_ts = seq, ts
        now = time.monotonic()
        if not held:
            self.hole_since = 0.0
        elif not self.hole_since:
            self.hole_since = now
        elif now - self.hole_since > HOLE_WAIT or len(held) > MAX_HELD:
            # Another pod's deliveries: the jump across the hole is not ours to judge.
            self.cursor, self.last_first, self.hole_since = min(held), 0, 0.0
            self._advance()

    def nakd(self, seq: int, ts: int) -> None:
        self.awaiting[seq] = ts

    def copied(self, seq: int) -> None:
        self.awaiting.pop(seq, None)
        self.suspects.discard(seq)

    async def check(self) -> None:
        """Nak'ed sequences the stream no longer holds: suspects at one check, lost at the next if
        they did not come back in between (a redelivery may sit in a worker's buffer for a moment)."""
        self.checked = time.monotonic()
        if self.held:
            self._advance()  # a hole waited out while no delivery came
        if not self.awaiting or not self.account:
            return
        ep = self.ledger.ep
        try:
            first = (await ep.source_js.stream_info(ep.source_stream)).state.first_seq
        except NATS_ERRORS as err:
            log.debug("%s cannot read stream %s: %s", ep.worker, ep.source_stream, err)
            return
        gone = sorted(s for s in self.suspects if s in self.awaiting)
        self.suspects = {s for s in self.awaiting if s < first} - set(gone)
        start = prev = 0
        times = {seq: self.awaiting.pop(seq, 0) for seq in gone}
        for seq in gone:
            if start and seq == prev + 1:
                prev = seq
                continue
            if start:
                self.ledger.lost(start, prev, times[start], times[prev])
            start = prev = seq
        if start:
            self.ledger.lost(start, prev, times[start], times[prev])


async def _metadata(ledger: LossLedger) -> dict[str, str] | None:
    ep = ledger.ep
    try:
        return (await ep.source_js.consumer_info(ep.source_stream, ledger.consumer)).config.metadata
    except NATS_ERRORS:  # not created yet: nothing to carry forward
        return None
