"""Where one writer stands on the target: how its copies are confirmed, and how resuming finds them.

**Confirmation.** The ordered copier pipelines its publishes yet keeps them in order with a chain:
each carries `Nats-Expected-Last-Msg-Id` naming its predecessor's `Nats-Msg-Id` (`Copy.block`). The
server checks it against the id of the last message *stored in the stream*, so when anything
else lands in between (another city fanning into the same stream, any other publisher) or the
predecessor failed, the message and everything after it are refused (10070): what landed is
always a prefix, and the copier re-sends the rest, the first one alone (no check). A message is
confirmed by its own PubAck, or, written in a fast-ingest batch, by the batch's flow ack or commit
(`batching.py`); `ack_seq` reads the target sequence from a PubAck, the lower bound of any later
search. Resuming is the same for both.

**Resuming** (`TargetPosition.last_landed`) must find this writer's newest copy even when other
writers wrote after it, on the same subjects: the last message on the subject filter is tried
first (the common case: a single writer, or this one wrote last); otherwise the target is read
backwards, headers only, in growing chunks, down to the lower bounds the caller knows (the last
confirmed target sequence; a time before which none of the uncertain copies can have landed).
Copies of one writer are in source order on the target, so the first one met is the newest.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from replicator.copier.provenance import CHORIA_SOURCE, PROVENANCE, Writer, parse_choria_source, parse_provenance
from replicator.transport.errors import NATS_ERRORS
from replicator.transport.streams import ack_floor
from replicator.transport.wire import ACK_PENDING, ACK_STREAM_SEQ, ACK_TIMESTAMP, ack_tokens

log = logging.getLogger(__name__)

MAX_CLOCK_SKEW_NS = 120 * 1_000_000_000  # between the source's, this host's and the target's clocks
FIRST_CHUNK, MAX_CHUNK = 256, 65_536


def ack_seq(pub_ack: bytes) -> int:
    """The target stream sequence in a PubAck (`{"stream":"X","seq":N,...}`); 0 if absent."""
    at = pub_ack.find(b'"seq":')
    if at < 0:
        return 0
    start = end = at + 6
    while end < len(pub_ack) and 48 <= pub_ack[end] <= 57:
        end += 1
    return int(pub_ack[start:end] or b"0")


@dataclass
class Landed:
    source_seq: int  # newest source sequence of this writer found on the target (or the floor)
    target_seq: int = 0  # its target sequence, when found


class TargetPosition:
    """This writer's copies in one target stream, found by their provenance header."""

    def __init__(self, target_nc: Client, target_stream: str, subject: str, writer: Writer,
                 choria: tuple[str, str] | None = None) -> None:
        self.nc = target_nc
        self.stream = target_stream
        self.subject = subject  # the target subjects this writer publishes to (wildcards allowed)
        self.writer = writer
        # (replicator, name) of a Go-format profile: the Go tool's own copies count as ours.
        self.choria = choria

    def _ours(self, headers: dict[str, str] | None, legacy: tuple[int, int] | None) -> int:
        """The source sequence of a copy of ours, else 0. Copies by the previous release (no writer
        field) count only inside `legacy` (floor..last delivered): another site's old copies with
        the same stream and name would otherwise pass for ours."""
        prov = parse_provenance((headers or {}).get(PROVENANCE))
        if prov is None and self.choria is not None:
            # Only `Choria-SR-Source`: a copy the Go Stream Replicator made before we took over. Like
            # the previous release's copies, it counts only inside the uncertain range when known.
            seq = parse_choria_source((headers or {}).get(CHORIA_SOURCE), self.writer.source_stream, *self.choria)
            return seq if seq and (legacy is None or legacy[0] <= seq <= legacy[1]) else 0
        if prov is None or not self.writer.owns(prov):
            return 0
        if prov.legacy and legacy is not None and not legacy[0] <= prov.seq <= legacy[1]:
            return 0
        return prov.seq

    async def last_landed(self, *, floor: int, scan: bool, since_seq: int = 0, not_before_ns: int = 0,
                          legacy: tuple[int, int] | None = None) -> Landed:
        """The newest copy of ours, at least `floor` (a source sequence known to have landed).

        `scan=False`: look at the newest message only. Otherwise read back from the end until a copy
        of ours, target sequence `since_seq`, or messages stored before `not_before_ns` (unix ns).
        """
        js = self.nc.jetstream(timeout=10)
        try:
            last = await js.get_last_msg(self.stream, self.subject)
        except NotFoundError:
            return Landed(floor)
        seq = self._ours(last.headers, legacy)
        if seq:
            return Landed(max(seq, floor), int(last.seq or 0))
        if not scan:
            return Landed(floor)
        hi, chunk = int(last.seq or 0) - 1, FIRST_CHUNK
        while hi > since_seq:
            lo = max(since_seq + 1, hi - chunk + 1)
            found, target_seq, oldest_ns = await self._scan(lo, hi, legacy)
            if found:
                return Landed(max(found, floor), target_seq)
            if not_before_ns and oldest_ns and oldest_ns < not_before_ns:
                break
            hi, chunk = lo - 1, min(chunk * 4, MAX_CHUNK)
        return Landed(floor)

    async def _scan(self, lo: int, hi: int, legacy: tuple[int, int] | None) -> tuple[int, int, int]:
        """(newest source seq of ours, its target seq, oldest store time in ns) among target
        sequences lo..hi on our subjects, read through a short-lived headers-only consumer."""
        js = self.nc.jetstream(timeout=10)
        config = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                                opt_start_seq=lo, headers_only=True, inactive_threshold=10.0, max_waiting=1)
        psub = await js.pull_subscribe(self.subject, durable=None, stream=self.stream, config=config)
        found = found_at = oldest = 0
        try:
            while True:
                try:
                    msgs = await psub.fetch(min(1000, hi - lo + 1), timeout=2)
                except TimeoutError:
                    break
                done = False
                for m in msgs:
                    tokens = ack_tokens(m.reply)
                    target_seq = int(tokens[ACK_STREAM_SEQ])
                    if target_seq > hi:
                        done = True
                        break
                    oldest = oldest or int(tokens[ACK_TIMESTAMP])
                    seq = self._ours(m.headers, legacy)
                    if seq:
                        found, found_at = seq, target_seq
                    if target_seq == hi or int(tokens[ACK_PENDING]) == 0:
                        done = True
                if done or not msgs:
                    break
        finally:  # the consumer goes by itself when inactive: cleaning up is a courtesy
            with contextlib.suppress(*NATS_ERRORS):
                await psub.unsubscribe()
            with contextlib.suppress(*NATS_ERRORS):
                await js.delete_consumer(self.stream, psub._consumer)
        return found, found_at, oldest


@dataclass
class Resume:
    next_seq: int  # the first source sequence to copy
    resuming: bool  # False: a first start (the profile's start position applies)
    target_seq: int  # target sequence of the newest copy found (0 if unknown)


async def resume_point(position: TargetPosition, source_js: JetStreamContext, source_stream: str,
                       consumer: str, topic: str) -> Resume:
    """Where an ordered writer starts: after the later of its newest copy on the target and the
    durable consumer's ack floor (acknowledged only after the target confirmed).

    Messages delivered but not acknowledged (a crash) may or may not have landed: only then is the
    target searched past its newest message, back to when the first of them was stored on the
    source (less the clock skew allowance). With no consumer (first start, or a re-created source
    stream) only the newest message is looked at.
    """
    try:
        info = await source_js.consumer_info(source_stream, consumer)
    except NotFoundError:
        landed = await position.last_landed(floor=0, scan=False)
        return Resume(landed.source_seq + 1, landed.source_seq > 0, landed.target_seq)
    floor = ack_floor(info)
    delivered = info.delivered.stream_seq if info.delivered and info.delivered.stream_seq else floor
    pending = bool(info.num_ack_pending)
    not_before = 0
    if pending:
        with contextlib.suppress(*NATS_ERRORS):  # then the target is searched without a time bound
            first = await source_js.get_msg(source_stream, seq=floor + 1, subject=topic, next=True)
            if first.time is not None:
                not_before = int(first.time.timestamp() * 1e9) - MAX_CLOCK_SKEW_NS
    landed = await position.last_landed(floor=floor, scan=pending, not_before_ns=not_before,
                                        legacy=(floor, max(floor, delivered)))
    return Resume(landed.source_seq + 1, True, landed.target_seq)
