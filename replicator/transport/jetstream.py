"""Pipelined JetStream primitives: a pull client and a publisher that keep many messages in flight.

nats-py's `fetch` and `publish_async` parse a JSON reply and build objects per message; at fleet
rates that per-message work dominates. These speak the JetStream wire API directly, on raw
subscriptions (`wire.py`): pull requests to `$JS.API.CONSUMER.MSG.NEXT` whose deliveries arrive
as `RawMsg`, acknowledgement replies parsed from their subject, and publish acknowledgements
judged without JSON unless they carry an error.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import MaxPayloadError
from nats.js import api

from replicator.transport.errors import NATS_ERRORS
from replicator.transport.header_block import encode, status
from replicator.transport.wire import (
    RawMsg,
    hpub,
    send_frames,
    send_hpub,
    subscribe_raw,
    subscribe_raw_batches,
    unsubscribe_raw,
)


class _DirectQueue:
    """Stands in for a subscription's pending queue and hands each message straight to a handler.

    nats-py routes every message through an asyncio.Queue and a task per subscription; for an
    inbox that carries a whole stream's worth of messages, that hop costs more than the work
    itself. Subscribing without a callback and swapping the queue keeps nats-py's parsing,
    reconnect and unsubscribe logic while skipping the hop. (The copy loops go further, past the
    parsing too: `wire.subscribe_raw`.)
    """

    def __init__(self, handler: Callable[[Msg], None]) -> None:
        self.put_nowait = handler

    def qsize(self) -> int:
        return 0

    def empty(self) -> bool:
        return True

    def task_done(self) -> None:
        return None

    async def join(self) -> None:
        return None

    async def get(self) -> Msg:
        await asyncio.get_running_loop().create_future()  # never: messages go to the handler
        raise AssertionError("unreachable")


async def direct_subscribe(nc: Client, subject: str, handler: Callable[[Msg], None]) -> Subscription:
    sub = await nc.subscribe(subject, pending_msgs_limit=0, pending_bytes_limit=0)
    sub._pending_queue = _DirectQueue(handler)  # type: ignore[assignment]
    return sub


class PublishError(Exception):
    """The target refused a message (or did not answer); `code` is JetStream's err_code when known."""

    def __init__(self, description: str, code: int = 0, status: int = 0) -> None:
        super().__init__(description)
        self.description = description
        self.code = code
        self.status = status


PULL_BATCH = 500  # messages per pull request, unless configured: the least, for large messages
PULL_BATCH_MAX = 10_000
PULL_REQUEST_BYTES = 1024 * 1024  # unless configured, a request asks for about this much


class Puller:
    """Pull consumer client that keeps up to `window` messages requested and buffered.

    Each pull request has its own reply subject, so expiry and status replies settle exactly the
    request they belong to; a deadline per request bounds any drift.
    """

    def __init__(
        self,
        nc: Client,
        stream: str,
        consumer: str,
        *,
        batch: int | None,
        expires: float = 5.0,
        wake: asyncio.Event | None = None,
        api_prefix: str = "$JS.API",
    ) -> None:
        self.nc = nc
        self.subject = f"{api_prefix}.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self.sized = batch is None  # messages per request follow the message size (`size_for`)
        self.batch = batch or PULL_BATCH
        self.expires = expires
        self.wake = wake or asyncio.Event()
        self.buffer: deque[RawMsg] = deque()
        self._outstanding: dict[str, list[float]] = {}  # request id -> [remaining, deadline]
        self._arrived = 0  # messages not yet counted against the outstanding requests
        self._ids = itertools.count(1)
        self._inbox = ""
        self._sub: Subscription | None = None
        self.last_status: tuple[int, str] | None = None

    async def start(self) -> None:
        self._inbox = self.nc.new_inbox()
        self._sub = await subscribe_raw_batches(self.nc, self._inbox + ".*", self._on_msgs)

    async def stop(self) -> None:
        if self._sub is not None:
            await unsubscribe_raw(self.nc, self._sub)
            self._sub = None

    @property
    def requested(self) -> int:
        """Messages asked for and not yet arrived; requests past their deadline are dropped here,
        not only when asking for more: a reconnect can lose requests whose count would otherwise
        hold off every further request."""
        self._count_arrivals()
        now = time.monotonic()
        for rid in [rid for rid, r in self._outstanding.items() if r[1] < now]:
            del self._outstanding[rid]  # expired without a status reply (e.g. lost in a reconnect)
        return int(sum(r[0] for r in self._outstanding.values()))

    def _count_arrivals(self) -> None:
        """Charge arrived messages to the open requests, oldest first (the order the server fills them).

        Done when the counts are needed rather than per message: per message it cost more than
        the rest of receiving one.
        """
        arrived, self._arrived = self._arrived, 0
        while arrived and self._outstanding:
            rid, req = next(iter(self._outstanding.items()))
            take = min(arrived, int(req[0]))
            req[0] -= take
            arrived -= take
            if req[0] <= 0:
                del self._outstanding[rid]

    def size_for(self, message_bytes: float) -> None:
        """Unless `batch` was configured: requests of about `PULL_REQUEST_BYTES` (at least
        `PULL_BATCH` messages). With small messages a copier that skips most (sampling) takes a
        message in a few microseconds, and requests of a few hundred left it waiting for the
        source server a quarter of the time; large messages are asked for as before."""
        if self.sized and message_bytes > 0:
            self.batch = max(PULL_BATCH, min(PULL_BATCH_MAX, int(PULL_REQUEST_BYTES / message_bytes)))

    async def request(self, room: int) -> None:
        """Ask for more so that buffered + requested covers `room` (in whole batches, and only once
        at least a quarter of a batch is missing)."""
        now = time.monotonic()
        want = room - len(self.buffer) - self.requested
        if want < min(self.batch, room) // 4:
            return  # not for a few: a request per freed slot piles up waiting requests on the server
        while want > 0:
            n = min(self.batch, want)
            rid = str(next(self._ids))
            self._outstanding[rid] = [n, now + self.expires + 1.0]
            body = json.dumps({"batch": n, "expires": int(self.expires * 1e9)}).encode()
            await self.nc.publish(self.subject, body, reply=f"{self._inbox}.{rid}")
            want -= n

    def reset(self) -> None:
        """Forget outstanding requests and buffered messages (after the consumer was recreated)."""
        self._outstanding.clear()
        self._arrived = 0
        self.buffer.clear()

    async def restart(self) -> None:
        """A fresh inbox: deliveries still on their way for the old requests are dropped with it."""
        await self.stop()
        self.reset()
        self.last_status = None
        await self.start()

    def _on_msgs(self, msgs: list[RawMsg]) -> None:
        first = msgs[0]
        if not first.reply:  # alone in its list (`subscribe_raw_batches`)
            self._on_status(first)
            return
        # Messages carry their original subject, not the request's: see `_count_arrivals`.
        self._arrived += len(msgs)
        self.buffer.extend(msgs)
        self.wake.set()

    def _on_status(self, msg: RawMsg) -> None:
        st = status(msg.hdr) if msg.hdr is not None else None
        if st is None:
            return  # no status and no ack subject: nothing a pull consumer delivers
        code, text = st
        if code == 100:  # idle heartbeat
            return
        # 404 no messages, 408 expired, 409 consumer deleted/leadership change/max waiting:
        # request over. Status replies come on the request's own reply subject, so they
        # settle exactly that request.
        self._count_arrivals()  # its own deliveries arrived before its status
        self._outstanding.pop(msg.subject.rsplit(".", 1)[-1], None)
        if code not in (404, 408):
            self.last_status = (code, text)
        self.wake.set()


OnResult = Callable[[object, bytes, "PublishError | None"], None]


class Publisher:
    """Publishes to JetStream without waiting: `publish` returns a future settled by the PubAck
    (its raw JSON, parsed only by whoever needs a field of it) or a `PublishError`; `publish_many`
    writes many messages in one go and hands each answer to `on_result(key, pub_ack, error)`,
    without a future per message."""

    def __init__(self, nc: Client, *, wake: asyncio.Event | None = None, on_result: OnResult | None = None) -> None:
        self.nc = nc
        self.wake = wake
        self.on_result = on_result
        self._futures: dict[str, asyncio.Future[bytes] | object] = {}  # token -> future, or publish_many's key
        self._ids = itertools.count(1)
        self._prefix = ""
        self._sub: Subscription | None = None

    async def start(self) -> None:
        self._prefix = self.nc.new_inbox()
        self._sub = await subscribe_raw(self.nc, self._prefix + ".*", self._on_ack)

    async def stop(self) -> None:
        self.forget_all()
        if self._sub is not None:
            await unsubscribe_raw(self.nc, self._sub)
            self._sub = None

    async def publish(
        self, subject: str, data: bytes, headers: bytes | Mapping[str, str] | None
    ) -> asyncio.Future[bytes]:
        """`headers`: a header block (`header_block`), or a mapping to encode as one."""
        token = str(next(self._ids))
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._futures[token] = fut
        hdr = headers if headers is None or isinstance(headers, bytes) else encode(headers)
        try:
            await send_hpub(self.nc, subject, f"{self._prefix}.{token}", hdr, data)
        except NATS_ERRORS as err:
            self._futures.pop(token, None)
            fut.set_exception(PublishError(f"publish failed: {type(err).__name__}: {err}"))
        return fut

    async def publish_many(self, messages: Sequence[tuple[str, bytes | None, bytes]],
                           keys: Sequence[object]) -> list[str]:
        """Publish (subject, header block, payload) messages in one write; each answer goes to
        `on_result` with its key. The tokens, for `drop`."""
        assert self.on_result is not None
        prefix, limit = self._prefix, self.nc._max_payload
        parts: list[bytes] = []
        tokens: list[str] = []
        size = sent = 0
        for (subject, hdr, payload), key in zip(messages, keys, strict=True):
            token = str(next(self._ids))
            try:
                parts += hpub(subject, f"{prefix}.{token}", hdr, payload, limit)
            except MaxPayloadError as err:
                self.on_result(key, b"", PublishError(f"publish failed: {type(err).__name__}: {err}"))
                tokens.append("")
                continue
            self._futures[token] = key
            tokens.append(token)
            size += len(payload)
            sent += 1
        if parts:
            try:
                await send_frames(self.nc, parts, size, sent)
            except NATS_ERRORS as err:
                for token in tokens:
                    key = self._futures.pop(token, None) if token else None
                    if key is not None:
                        self.on_result(key, b"", PublishError(f"publish failed: {type(err).__name__}: {err}"))
        return tokens

    def drop(self, token: str) -> bool:
        """Stop waiting for one of `publish_many`'s answers; False if it came already."""
        return self._futures.pop(token, None) is not None

    def forget_all(self) -> None:
        """Drop futures we no longer wait for: late acks for them are then ignored."""
        for fut in self._futures.values():
            if isinstance(fut, asyncio.Future) and not fut.done():
                fut.cancel()
        self._futures.clear()

    def _on_ack(self, subject: str, reply: str, hdr: bytes | None, data: bytes) -> None:
        waiting = self._futures.pop(subject.rsplit(".", 1)[-1], None)
        if waiting is None:
            return
        err = pub_ack_error(hdr, data)
        if not isinstance(waiting, asyncio.Future):
            assert self.on_result is not None
            self.on_result(waiting, data, err)
        elif waiting.done():
            return
        elif err is None:
            waiting.set_result(data)
        else:
            waiting.set_exception(err)
        if self.wake is not None:
            self.wake.set()


def pub_ack_error(hdr: bytes | None, data: bytes) -> PublishError | None:
    """The error in a publish acknowledgement (a status reply or JetStream's error JSON), if any."""
    st = status(hdr)
    if st is not None:
        code, text = st
        text = "no stream captures the subject" if code == 503 else text
        return PublishError(text or f"status {code}", status=code)
    if b'"error"' in data:
        err = json.loads(data).get("error", {})
        return PublishError(err.get("description", "error"), int(err.get("err_code", 0)), int(err.get("code", 0)))
    return None


async def ack(nc: Client, reply: str, on_error: Callable[[], None]) -> None:
    """A fire-and-forget +ACK; a failure is counted, and the message comes back after ack_wait."""
    try:
        await nc.publish(reply, b"+ACK")
    except NATS_ERRORS:
        on_error()


async def ack_many(nc: Client, replies: list[str], on_error: Callable[[], None]) -> None:
    """`ack` for many deliveries, in one write."""
    if not replies:
        return
    try:
        await send_frames(nc, [b"PUB %s 4\r\n+ACK\r\n" % r.encode() for r in replies], 4 * len(replies), len(replies))
    except NATS_ERRORS:
        for _ in replies:
            on_error()


async def nak(nc: Client, reply: str, delay: float, on_error: Callable[[], None]) -> None:
    try:
        await nc.publish(reply, b"-NAK " + json.dumps({"delay": int(delay * 1e9)}).encode())
    except NATS_ERRORS:
        on_error()


async def term(nc: Client, reply: str, on_error: Callable[[], None]) -> None:
    try:
        await nc.publish(reply, b"+TERM")
    except NATS_ERRORS:
        on_error()


def nothing_sent(info: api.ConsumerInfo) -> bool:
    """True when a fresh consumer has nothing to deliver and has delivered nothing.

    `num_pending == 0` alone is not enough: the server may already have sent every message,
    still unread in our socket, so "caught up" must then come from the last message itself.
    """
    return info.num_pending == 0 and (info.delivered is None or not info.delivered.consumer_seq)
