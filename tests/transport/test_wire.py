"""The raw read path (`transport/wire.py`) on real connections: exact bytes for raw subscriptions,
nats-py's own `Msg` for every other one on the same connection, across reads of any size, a
takeover in the middle of a message, and a reconnect."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.protocol.parser import Parser

from replicator.demo.local_nats import LocalNatsServer
from replicator.transport.wire import RawMsg, RawParser, install, send_hpub, subscribe_raw, subscribe_raw_batches

Raw = tuple[str, str, "bytes | None", bytes]

SIZES = [0, 1, 100, 4_000, 31_000, 33_000, 70_000, 300_000, 900_000]


async def _collect(got: list[Raw], n: int, within: float = 10.0) -> None:
    for _ in range(int(within / 0.02)):
        if len(got) >= n:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{len(got)} of {n} messages arrived")


@pytest.mark.timeout(60)
async def test_raw_and_regular_subscriptions_share_a_connection(target_nc: Client) -> None:
    """Messages of every size (single reads of 32 KB and messages many times that), with and
    without headers and reply subjects, interleaved with a regular subscription and requests."""
    got: list[Raw] = []
    await subscribe_raw(target_nc, "raw.>", lambda *m: got.append(m))
    regular = await target_nc.subscribe("plain.>")
    async def pong(msg: Msg) -> None:
        await msg.respond(b"pong:" + msg.data)

    replier = await target_nc.subscribe("svc", cb=pong)
    sent: list[Raw] = []
    for i, size in enumerate(SIZES):
        payload = bytes((i * 7 + j) % 251 for j in range(size))
        hdr = b"NATS/1.0\r\nX-Multi: a\r\nX-Multi: b\r\nX-Pad:  v  \r\n\r\n" if i % 2 else None
        reply = f"back.{i}" if i % 3 else ""
        await send_hpub(target_nc, f"raw.{i}", reply, hdr, payload)
        await target_nc.publish(f"plain.{i}", payload, headers={"X-I": str(i)})
        sent.append((f"raw.{i}", reply, hdr, payload))
        assert (await target_nc.request("svc", str(i).encode(), timeout=5)).data == b"pong:%d" % i
    await _collect(got, len(SIZES))
    assert got == sent
    for i, size in enumerate(SIZES):
        msg = await regular.next_msg(timeout=5)
        assert msg.subject == f"plain.{i}" and len(msg.data) == size and msg.headers == {"X-I": str(i)}
    assert isinstance(target_nc._ps, RawParser)
    await replier.unsubscribe()


@pytest.mark.timeout(30)
async def test_takeover_in_the_middle_of_a_message(target_nc: Client) -> None:
    """nats-py's parser has read a message's control line and half its payload when the raw parser
    takes over: the message arrives whole."""
    got: list[Raw] = []
    sub = await target_nc.subscribe("mid")
    await target_nc.flush()
    old = Parser(target_nc)
    await old.parse(b"HMSG mid %d r.1 12 17\r\nNATS/1.0\r\n\r\nhe" % sub._id)
    target_nc._ps = old
    raw = install(target_nc)
    raw.register(sub._id, lambda *m: got.append(m))
    await raw.parse(b"llo\r\nMSG mid %d 3\r\nabc\r\n" % sub._id)
    assert got == [("mid", "r.1", b"NATS/1.0\r\n\r\n", b"hello"), ("mid", "", None, b"abc")]


@pytest.mark.timeout(60)
async def test_raw_subscriptions_survive_a_reconnect(target_server: LocalNatsServer) -> None:
    nc = await nats.connect(target_server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    try:
        got: list[Raw] = []
        await subscribe_raw(nc, "raw.x", lambda *m: got.append(m))
        await nc.flush()
        await asyncio.to_thread(target_server.stop)
        await asyncio.to_thread(target_server.start)
        for _ in range(100):
            if nc.is_connected:
                break
            await asyncio.sleep(0.1)
        await nc.flush(timeout=5)
        await send_hpub(nc, "raw.x", "", None, b"after")
        await _collect(got, 1)
        assert got == [("raw.x", "", None, b"after")]
    finally:
        await nc.close()


@pytest.mark.timeout(30)
async def test_batched_subscription_gets_a_list_per_read(target_nc: Client) -> None:
    """A pull consumer's way: a read's messages in one list, in order; a message without a reply
    subject (a status reply) comes in a list of its own, after those before it."""
    lists: list[list[RawMsg]] = []
    await subscribe_raw_batches(target_nc, "many.>", lists.append)
    for i in range(2_000):
        reply = "" if i == 1_000 else f"ack.{i}"
        await send_hpub(target_nc, f"many.{i}", reply, None, b"%d" % i)
    got: list[RawMsg] = []
    for _ in range(500):
        got = [m for batch in lists for m in batch]
        if len(got) == 2_000:
            break
        await asyncio.sleep(0.02)
    assert [m.data for m in got] == [b"%d" % i for i in range(2_000)]
    assert [m.subject for m in got][:2] == ["many.0", "many.1"] and got[5].reply == "ack.5"
    alone = [batch for batch in lists if any(not m.reply for m in batch)]
    assert len(alone) == 1 and len(alone[0]) == 1 and alone[0][0].data == b"1000"
    assert len(lists) < 2_000 / 2  # whole reads, not a call per message


def _frames(sid: int) -> tuple[bytes, list[Raw]]:
    """A read stream of messages with and without headers, an empty one and a PING among them."""
    hdr = b"NATS/1.0\r\nA: 1\r\n\r\n"
    wire = (b"MSG cut.a %d $JS.ACK.S.c.1.1.1.0.0 5\r\nhello\r\n" % sid
            + b"HMSG cut.b %d r.2 %d %d\r\n%sabc\r\n" % (sid, len(hdr), len(hdr) + 3, hdr)
            + b"PING\r\n"
            + b"MSG cut.c %d r.3 0\r\n\r\n" % sid
            + b"HMSG cut.d %d r.4 %d %d\r\n%s\r\n" % (sid, len(hdr), len(hdr), hdr))
    want: list[Raw] = [("cut.a", "$JS.ACK.S.c.1.1.1.0.0", None, b"hello"), ("cut.b", "r.2", hdr, b"abc"),
                       ("cut.c", "r.3", None, b""), ("cut.d", "r.4", hdr, b"")]
    return wire, want


async def _parsed(nc: Client, sid: int, pieces: list[bytes], batched: bool = False) -> list[Raw]:
    """What a fresh raw parser delivers for `pieces`, each one read."""
    got: list[Raw] = []
    raw = RawParser(nc)
    if batched:
        raw.register_batches(sid, lambda msgs: got.extend((m.subject, m.reply, m.hdr, m.data) for m in msgs))
    else:
        raw.register(sid, lambda *m: got.append(m))
    for piece in pieces:
        await raw.parse(piece)
    return got


@pytest.mark.timeout(120)
async def test_messages_cut_anywhere_by_the_reads(target_nc: Client) -> None:
    """Every way two read boundaries can fall (in a control line, a header block, a payload, at a
    frame's edge) delivers the same messages, once each and in order, to both kinds of raw
    subscription; and a large message cut into many reads arrives whole."""
    sub = await target_nc.subscribe("cut.>")
    await target_nc.flush()
    wire, want = _frames(sub._id)
    for batched in (False, True):
        for first in range(1, len(wire)):
            for second in range(first, len(wire), 7 if batched else 3):
                pieces = [wire[:first], wire[first:second], wire[second:]]
                assert await _parsed(target_nc, sub._id, pieces, batched) == want, (first, second)
    big = bytes(range(256)) * 1200
    stream = b"MSG cut.big %d r.9 %d\r\n%s\r\n" % (sub._id, len(big), big) + wire
    for step in (1000, 65_536, len(stream) - len(wire) - 1):
        pieces = [stream[at:at + step] for at in range(0, len(stream), step)]
        assert await _parsed(target_nc, sub._id, pieces) == [("cut.big", "r.9", None, big), *want], step
