"""Messages the target will never take, and failures nobody has classified.

A *poison* message (a `PERMANENT` failure, `failures.py`) is given up after `POISON_ATTEMPTS`:
published to the `dead_letter` subject when one is configured (every server-interpreted header
made inert, the error attached), else skipped; counted in `poison_msgs`, logged once with its
source sequence. The messages behind it are copied as usual.

A failure of an `UNKNOWN` kind is retried like a transient one; after `UNKNOWN_GRACE` seconds on
the same message the worker reports itself *stuck*: the `stuck` gauge, `/readyz`, one error log
line and a note in the durable consumer's metadata, which `stream-replicator report` shows. It
keeps retrying: an error nobody understands never drops a message.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import re
import time
from collections.abc import Mapping

from replicator.copier.endpoints import PUBLISH_TIMEOUT, Endpoints
from replicator.copier.failures import UNKNOWN_GRACE
from replicator.copier.headers import HeaderPolicy
from replicator.copier.provenance import MSG_ID, PROVENANCE, Writer
from replicator.transport.jetstream import Publisher, PublishError
from replicator.transport.streams import set_consumer_note
from replicator.transport.wire import RawMsg

log = logging.getLogger(__name__)

STUCK_NOTE = "stream-replicator.stuck"  # a consumer metadata key per worker: `<STUCK_NOTE>.<worker>`
NOTE_REFRESH = 60.0  # seconds: a stuck worker writes its note again this often...
NOTE_STALE = 300.0  # ...and `report` leaves out one older than this: its worker was killed while stuck
_AS_OF = re.compile(r" \(as of (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)\)$")
STAMP = "%Y-%m-%dT%H:%M:%SZ"
ERROR = "Stream-Replicator-Error"
SUBJECT = "Stream-Replicator-Subject"
PAYLOAD_SIZE = "Stream-Replicator-Payload-Size"


def stuck_notes(metadata: Mapping[str, str], now: dt.datetime | None = None) -> str:
    """What the workers of a consumer noted as stuck, one entry each (scaled mode's workers share
    the consumer: one worker clearing its note leaves the others'), without the notes no worker
    has renewed for `NOTE_STALE` seconds (pods that were killed while stuck)."""
    now = now or dt.datetime.now(dt.UTC)
    notes = []
    for key, value in sorted(metadata.items()):
        if not value or not (key == STUCK_NOTE or key.startswith(f"{STUCK_NOTE}.")):
            continue
        as_of = _AS_OF.search(value)
        if as_of and (now - dt.datetime.strptime(as_of[1], STAMP).replace(tzinfo=dt.UTC)).total_seconds() > NOTE_STALE:
            continue
        notes.append(value)
    return "; ".join(notes)


def describe(err: PublishError) -> str:
    return f"{err.description} (code {err.code})" if err.code else err.description


async def give_up(ep: Endpoints, publisher: Publisher, writer: Writer, msg: RawMsg, seq: int, ts_ns: int,
                  subject: str, err: PublishError, attempts: int) -> None:
    """Dead-letter (when configured) or skip one poison message; counted and logged once."""
    m = ep.metrics
    m.poison_msgs.inc()
    where = "skipped"
    subject_dl = ep.profile.settings.dead_letter
    if subject_dl:
        if await _dead_letter(ep, publisher, writer, msg, seq, ts_ns, subject, err):
            m.dead_letter_msgs.inc()
            where = f"dead-lettered to {subject_dl}"
        else:
            where = f"skipped (the dead_letter subject {subject_dl} did not take it either)"
    log.error("%s gave up on source sequence %d after %d attempts: %s; %s (counted in poison_msgs)",
              ep.worker, seq, attempts, describe(err), where)


async def _dead_letter(ep: Endpoints, publisher: Publisher, writer: Writer, msg: RawMsg, seq: int, ts_ns: int,
                       subject: str, err: PublishError) -> bool:
    head = HeaderPolicy().apply_block(msg.hdr).head  # inert: no feature honoured
    lines = {PROVENANCE: writer.provenance(seq, ts_ns), MSG_ID: f"{writer.msg_id(seq)}:dead",
             ERROR: describe(err), SUBJECT: subject}
    head += "".join(f"{k}: {' '.join(v.splitlines())}\r\n" for k, v in lines.items()).encode()
    assert ep.profile.settings.dead_letter
    for payload in (msg.data, b""):  # too large for the target? then the record without the payload
        if not payload:
            head += f"{PAYLOAD_SIZE}: {len(msg.data)}\r\n".encode()
        fut = await publisher.publish(ep.profile.settings.dead_letter, payload, head + b"\r\n")
        try:
            await asyncio.wait_for(fut, PUBLISH_TIMEOUT)
            return True
        except (PublishError, TimeoutError) as failure:
            log.warning("%s dead letter for source sequence %d refused: %s", ep.worker, seq, failure)
        if not msg.data:
            break
    return False


class StuckWatch:
    """Messages failing with an unclassified error, and whether one has failed for too long."""

    def __init__(self, ep: Endpoints, consumer: str, grace: float | None = None) -> None:
        self.ep = ep
        self.consumer = consumer
        self.grace = UNKNOWN_GRACE if grace is None else grace
        self.since: dict[int, float] = {}  # source seq -> first unknown failure (monotonic)
        self.stuck: str | None = None  # what is reported while stuck
        self.stuck_seq = 0
        self.noted = 0.0  # when the note was last written (monotonic)

    async def failed(self, seq: int, err: PublishError) -> None:
        now = time.monotonic()
        first = self.since.setdefault(seq, now)
        if self.stuck is None and now - first >= self.grace:
            when = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=now - first)
            self.stuck_seq = seq
            self.stuck = (f"source sequence {seq} failing since {when:{STAMP}} with an error "
                          f"this release does not classify: {describe(err)}")
            self.ep.metrics.stuck.set(1)
            log.error("%s is stuck: %s (still retrying)", self.ep.worker, self.stuck)
            await self._note_stuck(now)
        elif self.stuck is not None and now - self.noted >= NOTE_REFRESH:
            await self._note_stuck(now)

    async def stopped(self) -> None:
        """A worker stopping while stuck takes its note with it (a killed one leaves it to go stale)."""
        if self.stuck is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._note(None), 2.0)

    async def _note_stuck(self, now: float) -> None:
        self.noted = now
        await self._note(f"{self.ep.worker}: {self.stuck} (as of {dt.datetime.now(dt.UTC):{STAMP}})")

    async def done(self, seq: int) -> None:
        """`seq` landed or was given up (scaled mode: messages settle one by one)."""
        if self.since.pop(seq, None) is not None and seq == self.stuck_seq:
            await self._unstuck()

    async def settled_upto(self, seq: int) -> None:
        """Everything up to `seq` landed or was given up (ordered mode: progress is cumulative)."""
        for s in [s for s in self.since if s <= seq]:
            del self.since[s]
        if self.stuck is not None and self.stuck_seq <= seq:
            await self._unstuck()

    async def _unstuck(self) -> None:
        log.info("%s is no longer stuck: source sequence %d went through", self.ep.worker, self.stuck_seq)
        self.stuck, self.stuck_seq = None, 0
        self.ep.metrics.stuck.set(0)
        await self._note(None)

    async def _note(self, text: str | None) -> None:
        with contextlib.suppress(Exception):
            await set_consumer_note(self.ep.source_js, self.ep.source_stream, self.consumer,
                                    f"{STUCK_NOTE}.{self.ep.worker}", text)
