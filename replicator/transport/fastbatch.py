"""The client side of JetStream's fast-ingest batch publishing (ADR-50; server 2.14+, a stream with
`allow_batched`): messages go out without one acknowledgement each, and the server confirms them
in flow acknowledgements.

The protocol lives in each message's reply subject, `<inbox>.<batch>.<flow>.fail.<seq>.<op>.$FI`
(op 0 opens the batch, 1 appends, 3 commits without storing a message, 4 pings), and the server
answers on those subjects with:

- flow acks `{"type":"ack","seq":K,"msgs":M}`: batch messages 1..K are stored (and M is the
  cadence of the next acks); the first message always gets one (`seq` 0);
- `{"type":"gap",...}` (messages lost in transit) or `{"type":"err","seq":n,...}` (refused before
  storing): with `fail` the batch ends there, and a final PubAck says how far it got;
- a plain PubAck error for a failure while storing (and for any failure of message 1): the batch
  does **not** end, so later messages may still be stored; only a chain of predecessor checks on
  every message (the ordered copier's) keeps what landed a prefix;
- the final PubAck `{"stream":..,"seq":N,"batch":..,"count":K}` for a commit.

A ping is answered with the last flow ack sent, or a gap frame when the server has fewer messages
than the ping claims, so it proves the batch alive, not the tail stored: only a commit confirms
the messages after the last flow boundary. Batches live in the stream leader's memory: a restart
or 10 s without messages ends them (10208 on the next message); what was stored stays.
`BatchRouter` holds one subscription for all of a copier's batches and hands each frame to its
batch; a batch that was given up just stops listening.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time

from nats.aio.client import Client
from nats.aio.subscription import Subscription

from replicator.transport.header_block import status
from replicator.transport.jetstream import PublishError
from replicator.transport.wire import fast_batch_frames, send_frames, send_hpub, subscribe_raw, unsubscribe_raw

log = logging.getLogger(__name__)

FLOW = 500  # the most messages per flow ack the server grants
GAP_MODE = "fail"  # a lost message ends the batch: nothing after a hole is stored


class FastBatch:
    """One batch: what was sent, what the server confirmed, and how it ended."""

    def __init__(self, nc: Client, prefix: str, bid: str, flow: int = FLOW) -> None:
        self.nc = nc
        self.id = bid
        self.flow = max(1, min(flow, FLOW))  # asked for; the server may grant less
        self._reply = f"{prefix}.{bid}.{self.flow}.{GAP_MODE}."
        self.reconnects = nc.stats["reconnects"]  # a reconnect since then may have lost messages
        self.sent = 0  # highest batch sequence sent
        self.acked = 0  # highest batch sequence the server confirmed stored
        self.msgs = 0  # the server's flow cadence; 0 until the batch is open (first flow ack)
        self.error: PublishError | None = None  # the first failure; nothing is confirmed after it
        self.error_seq = 0  # the batch sequence that failure names (0: unknown)
        self.pub_ack: bytes | None = None  # the final PubAck
        self.committing = False
        self.legacy = False  # the server stored message 1 as a plain publish: no fast ingest there
        self.subject = ""  # the last subject sent (a commit or ping goes to a stream subject)
        self.progress = time.monotonic()  # last time something was confirmed or first left unconfirmed

    @property
    def open(self) -> bool:
        return self.msgs > 0

    @property
    def ended(self) -> bool:
        return self.error is not None or self.pub_ack is not None

    @property
    def unconfirmed(self) -> int:
        return self.sent - self.acked

    async def send(self, messages: list[tuple[str, bytes, bytes]]) -> int:
        """Send the next messages, (subject, header block, payload) each, in one write; the batch
        sequence of the first."""
        first = self.sent + 1
        if self.sent == self.acked:
            self.progress = time.monotonic()
        parts, payload_bytes = fast_batch_frames(messages, self._reply, self.sent)
        await send_frames(self.nc, parts, payload_bytes, len(messages))
        self.sent += len(messages)
        self.subject = messages[-1][0]
        return first

    async def commit(self) -> None:
        """End the batch without storing a message (EOB); the final PubAck confirms everything."""
        self.committing = True
        await send_hpub(self.nc, self.subject, f"{self._reply}{self.sent + 1}.3.$FI", None, b"")

    async def ping(self) -> None:
        await send_hpub(self.nc, self.subject, f"{self._reply}{self.sent}.4.$FI", None, b"")

    def fail(self, err: PublishError, seq: int = 0) -> None:
        if self.error is None:
            self.error, self.error_seq = err, seq

    def on_frame(self, seq: int, hdr: bytes | None, data: bytes) -> None:
        """A frame on the reply subject of batch message `seq`."""
        st = status(hdr)
        if st is not None:  # 503: no stream (or no JetStream) takes the subject
            code, text = st
            self.fail(PublishError("no stream captures the subject" if code == 503 else text or f"status {code}",
                                   status=code), seq)
            return
        try:
            frame = json.loads(data)
        except ValueError:
            self.fail(PublishError(f"unreadable batch reply {data[:80]!r}"), seq)
            return
        kind = frame.get("type")
        if kind == "ack":
            if self.error is None and not self.legacy:
                acked = int(frame.get("seq", 0))
                if acked > self.acked:
                    self.acked = acked
                    self.progress = time.monotonic()
                self.msgs = int(frame.get("msgs", 0)) or self.msgs or 1
        elif kind == "gap":
            self.fail(PublishError(f"batch messages {frame.get('last_seq')}..{int(frame.get('seq', 0)) - 1} "
                                   "lost in transit"), int(frame.get("last_seq", 0)))
        elif kind == "err":
            err = frame.get("error") or {}
            self.fail(_error(err), int(frame.get("seq", 0)) or seq)
        elif "error" in frame:  # a plain PubAck error: refused while storing, or message 1 refused
            self.fail(_error(frame["error"]), seq)
        elif "batch" not in frame and seq == 1 and not self.ended:
            self.legacy = True  # an older server took it as a plain publish: stored, and no batch
            self.acked, self.pub_ack = 1, data
        else:
            self.pub_ack = data
            count = int(frame.get("count", 0))
            if self.error is None:
                if count == self.sent:
                    self.acked = count
                    self.progress = time.monotonic()
                else:
                    self.fail(PublishError(f"batch committed {count} of {self.sent} messages"), count + 1)


def _error(err: dict[str, object]) -> PublishError:
    return PublishError(str(err.get("description", "error")), int(str(err.get("err_code", 0))),
                        int(str(err.get("code", 0))))


class BatchRouter:
    """One inbox subscription for a copier's batches; frames of batches given up are dropped."""

    def __init__(self, nc: Client, wake: asyncio.Event) -> None:
        self.nc = nc
        self.wake = wake
        self._batches: dict[str, FastBatch] = {}
        self._ids = itertools.count(1)
        self._prefix = ""
        self._base = ""
        self._sub: Subscription | None = None

    async def start(self) -> None:
        self._prefix = self.nc.new_inbox()
        self._base = self._prefix.rsplit(".", 1)[-1][:16]
        self._sub = await subscribe_raw(self.nc, self._prefix + ".>", self._on_frame)

    async def stop(self) -> None:
        self._batches.clear()
        if self._sub is not None:
            await unsubscribe_raw(self.nc, self._sub)
            self._sub = None

    def open(self, flow: int = FLOW) -> FastBatch:
        batch = FastBatch(self.nc, self._prefix, f"{self._base}{next(self._ids)}", flow)
        self._batches[batch.id] = batch
        return batch

    def forget(self, batch: FastBatch) -> None:
        self._batches.pop(batch.id, None)

    def _on_frame(self, subject: str, reply: str, hdr: bytes | None, data: bytes) -> None:
        tokens = subject.rsplit(".", 6)  # <prefix>.<batch>.<flow>.<gap>.<seq>.<op>.$FI
        if len(tokens) != 7:
            return
        batch = self._batches.get(tokens[1])
        if batch is None:
            return  # given up: its error storm, if any, is ignored
        batch.on_frame(int(tokens[4]), hdr, data)
        if batch.ended:
            self.forget(batch)
        self.wake.set()
