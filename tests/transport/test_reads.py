"""`ChunkReader`: the chunks a connection is fed, handed over whole and uncopied, with the stream's
lines, end, errors and flow control as `StreamReader` has them."""

from __future__ import annotations

import asyncio

import nats
import nats.aio.client
import pytest

from replicator.transport import reads
from replicator.transport.reads import ChunkReader, ChunkTransport


class PausableTransport(asyncio.ReadTransport):
    def __init__(self) -> None:
        super().__init__()
        self.paused = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


async def test_a_lone_chunk_is_handed_over_as_it_came() -> None:
    reader = ChunkReader(limit=1 << 20)
    await reader.read(0)  # the first read switches to chunks
    chunk = b"MSG a 1 3\r\nabc\r\n" * 1000
    reader.feed_data(chunk)
    assert await reader.read(1 << 20) is chunk


async def test_chunks_are_joined_up_to_the_size_asked_for() -> None:
    reader = ChunkReader(limit=1 << 20)
    await reader.read(0)
    for part in (b"a" * 10, b"b" * 10, b"c" * 10, b"d" * 50):
        reader.feed_data(part)
    assert await reader.read(35) == b"a" * 10 + b"b" * 10 + b"c" * 10  # whole chunks only
    assert await reader.read(10) == b"d" * 50  # one chunk, even when larger than asked
    waiting = asyncio.ensure_future(reader.read(100))
    await asyncio.sleep(0)
    assert not waiting.done()
    reader.feed_data(bytearray(b"late"))
    assert await waiting == b"late"


async def test_lines_before_the_first_read_and_the_rest_after() -> None:
    """nats-py reads INFO and the PONG of CONNECT as lines, then starts its read loop."""
    reader = ChunkReader(limit=1 << 20)
    reader.feed_data(b"INFO {}\r\nPONG\r\nMSG a 1 ")
    assert await reader.readline() == b"INFO {}\r\n"
    assert await reader.readline() == b"PONG\r\n"
    reader.feed_data(b"3\r\nabc\r\n")
    assert await reader.read(1 << 20) == b"MSG a 1 3\r\nabc\r\n"
    reader.feed_data(b"PING\r\n+OK\r\n")
    assert await reader.readline() == b"PING\r\n"  # a line read later takes the chunks back
    assert await reader.read(100) == b"+OK\r\n"


async def test_end_of_stream_and_errors() -> None:
    reader = ChunkReader(limit=1 << 20)
    await reader.read(0)
    reader.feed_data(b"tail")
    reader.feed_eof()
    assert not reader.at_eof()
    assert await reader.read(100) == b"tail"
    assert reader.at_eof() and await reader.read(100) == b""

    failing = ChunkReader(limit=1 << 20)
    await failing.read(0)
    waiting = asyncio.ensure_future(failing.read(100))
    await asyncio.sleep(0)
    failing.set_exception(ConnectionResetError("gone"))
    with pytest.raises(ConnectionResetError):
        await waiting


async def test_the_socket_is_paused_past_twice_the_limit_and_resumed_once_read() -> None:
    reader = ChunkReader(limit=100)
    transport = PausableTransport()
    reader.set_transport(transport)
    await reader.read(0)
    reader.feed_data(b"x" * 150)
    assert not transport.paused
    reader.feed_data(b"y" * 60)
    assert transport.paused  # 210 bytes held, over 2 x 100
    assert await reader.read(1000) == b"x" * 150 + b"y" * 60
    assert not transport.paused


async def test_connections_read_through_it(source_server) -> None:  # type: ignore[no-untyped-def]
    """Installed, every new nats-py connection reads through a `ChunkReader` (after a TLS upgrade
    too: `tests/security/test_tls.py`)."""
    reads.install()
    assert nats.aio.client.TcpTransport is ChunkTransport
    nc = await nats.connect(source_server.url)
    try:
        assert isinstance(nc._transport._io_reader, ChunkReader)
        assert nc._transport._io_writer.transport.max_size == max(256 * 1024, nats.aio.client.DEFAULT_BUFFER_SIZE)
        sub = await nc.subscribe("t.>")
        payload = bytes(range(256)) * 64
        for i in range(50):
            await nc.publish(f"t.{i}", payload)
        got = [await sub.next_msg(timeout=5) for _ in range(50)]
        assert [m.subject for m in got] == [f"t.{i}" for i in range(50)]
        assert all(m.data == payload for m in got)
    finally:
        await nc.close()
