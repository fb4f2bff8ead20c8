"""The data plane's way past nats-py's per-message work, in one place: raw reads and raw HPUBs.

nats-py turns every incoming message into a `Msg` with a parsed header dict, after a regex per
control line, and every outgoing one into an HPUB through a header dict and a regex per key. At
copy rates that is most of a copier's time, and the dict loses repeated header names and the
spaces around values. Here:

- `RawParser` replaces a connection's protocol parser. Subscriptions registered with
  `subscribe_raw` get each message as `(subject, reply, header block, payload)`, synchronously,
  with no `Msg`, no dict and no queue hop; every other subscription gets its `Msg` from nats-py's
  own `_process_msg` exactly as before. PING, PONG, INFO and -ERR go to nats-py's handlers, so
  the connection itself (reconnects, TLS, auth, pings, server discovery) stays nats-py's. nats-py
  resets the parser on reconnect; registrations survive it (it keeps subscription ids).
  `subscribe_raw_batches` hands over a read's messages as one list of `RawMsg` (a pull
  consumer's deliveries: one call, not one per message).
- `send_hpub` writes an HPUB frame from a header block built elsewhere as bytes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import nats.aio.client
from mypy_extensions import mypyc_attr
from nats.aio.client import Client
from nats.aio.subscription import Subscription
from nats.errors import ConnectionClosedError, MaxPayloadError, OutboundBufferLimitError, ProtocolError
from nats.protocol.parser import AWAITING_MSG_PAYLOAD, MAX_CONTROL_LINE_SIZE, Parser

from replicator.transport.errors import NATS_ERRORS
from replicator.transport.header_block import HeaderView, view

log = logging.getLogger(__name__)

RawHandler = Callable[[str, str, "bytes | None", bytes], None]  # subject, reply, header block, payload
BatchHandler = Callable[[list["RawMsg"]], None]  # the messages of one read, in order

READ_SIZE = 1024 * 1024  # bytes a connection's read loop takes from its socket buffer per turn


def ack_tokens(reply: str) -> list[str]:
    """The tokens of a JetStream ack subject, unconverted, in v1's layout: index them with the
    `ACK_*` constants and convert only what you use (the copy loops read every delivery's).

    v1: `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>`, as split;
    v2: `$JS.ACK.<domain>.<hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>[.<token>]`,
    without its domain and hash.
    """
    tokens = reply.split(".")
    n = len(tokens)
    if n == 9:
        return tokens
    if n >= 11:
        del tokens[2:4]
        return tokens
    raise ValueError(f"not a JetStream ack subject: {reply!r}")


ACK_DELIVERED, ACK_STREAM_SEQ, ACK_CONSUMER_SEQ, ACK_TIMESTAMP, ACK_PENDING = 4, 5, 6, 7, 8


class RawMsg:
    """A delivered message as it came off the wire: what the copy loops need, nothing parsed.

    `headers` parses the header block on demand (sampling by header, dead-lettering); the copy
    itself works on `hdr`, the block's bytes.
    """

    __slots__ = ("data", "hdr", "reply", "subject")

    def __init__(self, subject: str, reply: str, hdr: bytes | None, data: bytes) -> None:
        self.subject = subject
        self.reply = reply
        self.hdr = hdr
        self.data = data

    @property
    def headers(self) -> HeaderView | None:
        return view(self.hdr)


# An ordinary Python class even where this module is compiled (setup.py): a compiled class deriving from
# nats-py's would lay out its instances by what the compiler knew of that class when it ran, and a build
# that could not see nats-py crashed the collector.
@mypyc_attr(native_class=False)
class RawParser(Parser):
    """nats-py's `Parser`, faster, with a direct route for registered subscriptions."""

    def __init__(self, nc: Client, previous: Parser | None = None) -> None:
        self._by_sid: dict[bytes, RawHandler] = {}  # as the wire writes subscription ids
        self._batched: dict[bytes, BatchHandler] = {}
        self._subjects: dict[bytes, str] = {}
        # Named, not super(): compiled blind to nats-py (setup.py), super() would resolve to object.
        Parser.__init__(self, nc)
        self._previous = previous  # its unparsed bytes are taken over at the first `parse`

    def register(self, sid: int, handler: RawHandler | None) -> None:
        """Messages of subscription `sid` go to `handler` (None: back to nats-py)."""
        if handler is None:
            self._by_sid.pop(str(sid).encode(), None)
        else:
            self._by_sid[str(sid).encode()] = handler

    def register_batches(self, sid: int, handler: BatchHandler | None) -> None:
        """Messages of subscription `sid` go to `handler`, a list per read; a message without a
        reply subject (a status reply) comes in a list of its own, after those before it."""
        if handler is None:
            self._batched.pop(str(sid).encode(), None)
        else:
            self._batched[str(sid).encode()] = handler

    def reset(self) -> None:
        Parser.reset(self)
        self._pending = b""
        self._chunks: list[bytes] = []
        self._have = 0
        self._need = 0

    def _adopt(self) -> bytes:
        """What nats-py's parser left unparsed, to continue exactly where it stopped (it may be
        inside a message)."""
        prev, self._previous = self._previous, None
        assert prev is not None
        pending = bytes(prev.buf)
        if prev.state == AWAITING_MSG_PAYLOAD:  # its control line is consumed: write it back
            arg = prev.msg_arg
            subject, sid, reply = arg["subject"], arg["sid"], arg["reply"]
            if prev.header_needed:
                line = b"HMSG %s %d %s %d %d\r\n" % (subject, sid, reply, prev.header_needed, prev.needed)
            else:
                line = b"MSG %s %d %s %d\r\n" % (subject, sid, reply, prev.needed)
            pending = line + pending
        return pending

    async def parse(self, data: bytes = b"") -> None:
        # A message cut by the end of a read is completed alone: joining what was left to the whole
        # next read copied every read once more (at 16 KB, a message's worth of copying per message).
        data = bytes(data)
        start = 0
        if self._previous is not None:
            data = self._adopt() + data
        elif self._pending:  # a control line cut short: completed from this read's first line
            end = data.find(b"\n")
            if end < 0:
                data, self._pending = self._pending + data, b""
            else:
                line, self._pending = self._pending + data[:end + 1], b""
                start = end + 1
                await self._scan(line, 0)
        if self._need:
            missing = self._need - self._have
            if len(data) - start < missing:
                self._chunks.append(data[start:])
                self._have += len(data) - start
                return
            self._chunks.append(data[start:start + missing])
            whole = b"".join(self._chunks)
            self._chunks, self._have, self._need = [], 0, 0
            start += missing
            await self._scan(whole, 0)
        if start < len(data):
            await self._scan(data, start)

    async def _scan(self, buf: bytes, pos: int) -> None:
        """The messages in `buf` from `pos`; an incomplete one at its end is kept for the next read."""
        size = len(buf)
        handlers = self._by_sid
        batched = self._batched
        batches: dict[bytes, tuple[BatchHandler, list[RawMsg]]] = {}
        subjects = self._subjects
        nc = self.nc
        count = payload_bytes = 0
        run_sid: bytes | None = None  # the batched subscription of the message before, and its list
        run: list[RawMsg] = []
        while pos < size:
            end = buf.find(b"\r\n", pos)
            if end < 0:
                if size - pos > MAX_CONTROL_LINE_SIZE:
                    raise ProtocolError("nats: control line too long")
                break
            first = buf[pos]
            if first == 77:  # MSG <subject> <sid> [reply] <size> (no other server operation starts with M)
                args = buf[pos + 4:end].split()
                hlen = 0
                total = int(args[-1])
                nargs = len(args)
            elif first == 72:  # HMSG <subject> <sid> [reply] <header size> <size>
                args = buf[pos + 5:end].split()
                hlen = int(args[-2])
                total = int(args[-1])
                nargs = len(args) - 1
            else:
                await self._control(buf[pos:end])
                pos = end + 2
                continue
            start = end + 2
            stop = start + total
            if stop + 2 > size:  # the rest of this message is still on its way
                self._chunks, self._have, self._need = [buf[pos:]], size - pos, stop + 2 - pos
                pos = size
                break
            if nargs == 3:
                subject_b, sid_b, reply = args[0], args[1], b""
            elif nargs == 4:
                subject_b, sid_b, reply = args[0], args[1], args[2]
            else:
                raise ProtocolError("nats: malformed MSG")
            hdr = buf[start:start + hlen] if hlen else None
            payload = buf[start + hlen:stop]
            pos = stop + 2
            if sid_b == run_sid and reply:  # the commonest: one more delivery for the list in hand
                count += 1
                payload_bytes += stop - start - hlen
                run.append(RawMsg(subjects.get(subject_b) or self._subject(subject_b), reply.decode(), hdr, payload))
                continue
            handler = handlers.get(sid_b)
            batch_handler = batched.get(sid_b) if handler is None else None
            if handler is None and batch_handler is None:
                await nc._process_msg(int(sid_b), subject_b, reply, payload, hdr)  # type: ignore[arg-type]
                continue
            count += 1
            payload_bytes += stop - start - hlen
            subject = subjects.get(subject_b) or self._subject(subject_b)
            if batch_handler is None:
                try:
                    handler(subject, reply.decode(), hdr, payload)  # type: ignore[misc]
                except Exception:  # never let a handler's bug kill the connection's read loop
                    log.exception("handler for subscription %s failed", sid_b)
                continue
            msg = RawMsg(subject, reply.decode(), hdr, payload)
            pending = batches.get(sid_b)
            if reply:
                if pending is None:
                    pending = batches[sid_b] = (batch_handler, [msg])
                else:
                    pending[1].append(msg)
                run_sid, run = sid_b, pending[1]
                continue
            run_sid = None
            if pending is not None:
                _deliver(*batches.pop(sid_b), sid_b)
            _deliver(batch_handler, [msg], sid_b)
        for sid_b, (batch_handler, msgs) in batches.items():
            _deliver(batch_handler, msgs, sid_b)
        if count:
            stats = nc.stats
            stats["in_msgs"] += count
            stats["in_bytes"] += payload_bytes
        if pos < size:
            self._pending = buf[pos:]

    def _subject(self, subject_b: bytes) -> str:
        """A subject decoded once: a copy's subjects repeat, an inbox's do not (then start over)."""
        subjects = self._subjects
        if len(subjects) >= 4096:
            subjects.clear()
        subject = subjects[subject_b] = subject_b.decode()
        return subject

    async def _control(self, line: bytes) -> None:
        nc = self.nc
        op = line.rstrip()
        if op == b"PING":
            await nc._process_ping()
        elif op == b"PONG":
            await nc._process_pong()
        elif op.startswith(b"+OK"):
            return
        elif op.startswith(b"INFO"):
            await nc._process_info(json.loads(op[4:].strip().decode()))
        elif op.startswith(b"-ERR"):
            await nc._process_err(op[4:].strip().decode(errors="replace").lower())
        else:
            raise ProtocolError("nats: unknown protocol")


def _deliver(handler: BatchHandler, msgs: list[RawMsg], sid: bytes) -> None:
    try:
        handler(msgs)
    except Exception:  # never let a handler's bug kill the connection's read loop
        log.exception("handler for subscription %s failed", sid)


def widen_reads() -> None:
    """nats-py's read loop hands its parser at most 32 KB per turn and stops reading the socket at
    64 KB buffered (`DEFAULT_BUFFER_SIZE`, read at every connect and every read): at copy rates
    that is a turn, a parse call and a re-joined partial message per two 16 KB messages. Every
    connection of the process takes up to `READ_SIZE` per turn instead."""
    if nats.aio.client.DEFAULT_BUFFER_SIZE < READ_SIZE:
        nats.aio.client.DEFAULT_BUFFER_SIZE = READ_SIZE


def install(nc: Client) -> RawParser:
    """The connection's `RawParser`, put in place of nats-py's on first use."""
    parser = nc._ps
    if isinstance(parser, RawParser):
        return parser
    raw = RawParser(nc, parser)
    nc._ps = raw
    return raw


async def subscribe_raw(nc: Client, subject: str, handler: RawHandler) -> Subscription:
    """A subscription whose messages go straight to `handler` (see `RawParser`)."""
    parser = install(nc)
    sub = await nc.subscribe(subject, pending_msgs_limit=0, pending_bytes_limit=0)
    parser.register(sub._id, handler)
    return sub


async def subscribe_raw_batches(nc: Client, subject: str, handler: BatchHandler) -> Subscription:
    """A subscription whose messages go straight to `handler`, a list per read (see `RawParser`)."""
    parser = install(nc)
    sub = await nc.subscribe(subject, pending_msgs_limit=0, pending_bytes_limit=0)
    parser.register_batches(sub._id, handler)
    return sub


async def unsubscribe_raw(nc: Client, sub: Subscription) -> None:
    parser = nc._ps
    if isinstance(parser, RawParser):
        parser.register(sub._id, None)
        parser.register_batches(sub._id, None)
    try:
        await sub.unsubscribe()
    except NATS_ERRORS:  # closed or reconnecting: nothing more will arrive for it
        pass


async def send_hpub(nc: Client, subject: str, reply: str, hdr: bytes | None, data: bytes) -> None:
    """`nc.publish` for a header block already encoded (`header_block`), in one frame."""
    await send_frames(nc, list(hpub(subject, reply, hdr, data, nc._max_payload)), len(data), 1)


def hpub(subject: str, reply: str, hdr: bytes | None, data: bytes, max_payload: int = 0) -> tuple[bytes, ...]:
    """One PUB or HPUB frame, in parts: `send_frames` joins a write's parts once (a joined frame per
    message, then a join of the frames, would copy every payload twice). Over `max_payload` (headers
    + payload; 0: not checked) raises: the server would take it for a protocol violation and close
    the connection for good (nats-py does not reconnect after an -ERR)."""
    hlen = len(hdr) if hdr else 0
    if max_payload and hlen + len(data) > max_payload:
        raise MaxPayloadError
    to = f"{subject} {reply}".encode() if reply else subject.encode()
    if hdr:
        return b"HPUB %s %d %d\r\n" % (to, hlen, hlen + len(data)), hdr, data, b"\r\n"
    return b"PUB %s %d\r\n" % (to, len(data)), data, b"\r\n"


def fast_batch_frames(messages: list[tuple[str, bytes, bytes]], reply: str, seq: int) -> tuple[list[bytes], int]:
    """The frames of a fast-ingest batch's next messages, (subject, header block, payload) each,
    after batch message `seq`: their parts (`hpub`) and payload bytes. Each one's reply subject
    is the batch's `reply` prefix, its batch sequence and its operation (0: start, 1: append)."""
    parts: list[bytes] = []
    payload_bytes = 0
    for subject, hdr, payload in messages:
        seq += 1
        parts += hpub(subject, f"{reply}{seq}.{0 if seq == 1 else 1}.$FI", hdr, payload)
        payload_bytes += len(payload)
    return parts, payload_bytes


async def send_frames(nc: Client, parts: list[bytes], payload_bytes: int, messages: int) -> None:
    """The parts of `messages` frames (`hpub`), joined once and written as one command. The
    connection-state checks are nats-py's own, so buffering during a reconnect behaves exactly as
    with `publish`."""
    if nc.is_closed:
        raise ConnectionClosedError
    if not nc.is_connected and (nc._max_pending_size <= 0 or
                                payload_bytes + nc._pending_data_size > nc._max_pending_size):
        raise OutboundBufferLimitError
    nc.stats["out_msgs"] += messages
    nc.stats["out_bytes"] += payload_bytes
    await nc._send_command(parts[0] if len(parts) == 1 else b"".join(parts))
    if nc._flush_queue is not None and nc._flush_queue.empty():
        await nc._flush_pending()
