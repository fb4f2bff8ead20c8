"""A connection's reads without asyncio's two copies of every byte.

`asyncio.StreamReader` copies each chunk the socket gives into one `bytearray`, and `read()` copies
it out again as `bytes`: at 16 KB a message that is two copies of every payload before the parser
sees it (perf, 16 KB copier: user-space `memmove` 13% of its CPU). `ChunkReader` keeps the chunks as
they came and hands them over whole: one chunk is returned as it is, several are joined once.

nats-py reads its connection through `TcpTransport`, which builds a plain `StreamReader`, and it
reads lines (INFO, the PONG of CONNECT) only before its read loop starts; after that only `read`.
`ChunkTransport` is that transport with a `ChunkReader`, for plain and TLS connections alike, and
`install` puts it in nats-py's place for every connection of the process. Everything else about
the connection (reconnects, TLS, auth, pings, flow control of the socket) stays nats-py's and
asyncio's.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, SupportsIndex
from urllib.parse import ParseResult

import nats.aio.client
from nats.aio.transport import TcpTransport


class ChunkReader(asyncio.StreamReader):
    """`StreamReader` whose `read` hands over the chunks fed to it, uncopied where it can.

    Until the first `read`, data goes to the stream's own buffer (so `readline` works as ever);
    from then on to a list of chunks. A `readline` after that puts the chunks back first.
    """

    # StreamReader's own state, which typeshed does not declare.
    _buffer: bytearray
    _eof: bool
    _exception: BaseException | None
    _limit: int
    _paused: bool
    _transport: asyncio.ReadTransport | None

    if TYPE_CHECKING:
        def _wakeup_waiter(self) -> None: ...
        async def _wait_for_data(self, func_name: str) -> None: ...

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(limit=limit, loop=loop)
        self._chunks: list[bytes] = []
        self._chunked = 0  # bytes in `_chunks`
        self._raw = False

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:
        if not self._raw:
            super().feed_data(data)
            return
        assert not self._eof, "feed_data after feed_eof"
        if not data:
            return
        chunk = data if type(data) is bytes else bytes(data)  # sockets give bytes; SSL may not
        self._chunks.append(chunk)
        self._chunked += len(chunk)
        self._wakeup_waiter()
        transport = self._transport
        if transport is not None and not self._paused and self._chunked > 2 * self._limit:
            try:
                transport.pause_reading()
            except NotImplementedError:  # it cannot pause: everything is buffered, as StreamReader does
                self._transport = None
            else:
                self._paused = True

    async def read(self, n: int = -1) -> bytes:
        """At least one chunk, and whole chunks up to `n` bytes (a single chunk may be larger)."""
        if n < 0:
            return await super().read(n)
        if self._exception is not None:
            raise self._exception
        if not self._raw:
            self._raw = True
            buffered = self._buffer
            if buffered:
                self._chunks.insert(0, bytes(buffered))
                self._chunked += len(buffered)
                buffered.clear()
        if n == 0:
            return b""
        if not self._chunks and not self._eof:
            await self._wait_for_data("read")
        chunks = self._chunks
        if not chunks:
            return b""  # end of stream
        if len(chunks) == 1 or self._chunked <= n:
            data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            chunks.clear()
        else:
            take, total = 1, len(chunks[0])
            while take < len(chunks) and total + len(chunks[take]) <= n:
                total += len(chunks[take])
                take += 1
            data = chunks[0] if take == 1 else b"".join(chunks[:take])
            del chunks[:take]
        self._chunked -= len(data)
        self._maybe_resume_transport()
        return data

    def _maybe_resume_transport(self) -> None:
        if self._paused and self._chunked + len(self._buffer) <= self._limit and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()

    async def readline(self) -> bytes:
        self._unchunk()
        return await super().readline()

    async def readuntil(self, separator: Any = b"\n") -> bytes:
        self._unchunk()
        return await super().readuntil(separator)

    async def readexactly(self, n: int) -> bytes:
        self._unchunk()
        return await super().readexactly(n)

    def _unchunk(self) -> None:
        """Back to the stream's own buffer, for the line and exact reads `StreamReader` does."""
        if self._raw:
            self._raw = False
            self._buffer.extend(b"".join(self._chunks))
            self._chunks.clear()
            self._chunked = 0

    def at_eof(self) -> bool:
        return self._eof and not self._buffer and not self._chunks


class ChunkTransport(TcpTransport):
    """nats-py's TCP transport, reading through a `ChunkReader` before and after a TLS upgrade."""

    async def connect(self, uri: ParseResult, buffer_size: int, connect_timeout: int) -> None:
        assert uri.hostname is not None and uri.port is not None  # nats-py fills in the default port
        loop = asyncio.get_running_loop()
        reader = ChunkReader(limit=buffer_size, loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        transport, _ = await asyncio.wait_for(
            loop.create_connection(lambda: protocol, uri.hostname, uri.port), connect_timeout
        )
        widen_receives(transport, buffer_size)
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        # The first reader and writer are kept, as nats-py keeps them (see TcpTransport.connect).
        self._bare_io_reader = self._io_reader = reader
        self._bare_io_writer = self._io_writer = writer

    async def connect_tls(self, uri: str | ParseResult, ssl_context: ssl.SSLContext, buffer_size: int,
                          connect_timeout: int) -> None:
        assert self._io_writer, f"{type(self).__name__}.connect must be called first"
        loop = asyncio.get_running_loop()
        reader = ChunkReader(limit=buffer_size, loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        transport = await asyncio.wait_for(
            loop.start_tls(self._io_writer.transport, protocol, ssl_context,
                           server_hostname=uri if isinstance(uri, str) else uri.hostname),
            connect_timeout,
        )
        assert transport is not None
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        self._io_reader, self._io_writer = reader, writer


def widen_receives(transport: asyncio.BaseTransport, size: int) -> None:
    """Take up to `size` from the socket per receive, so per turn of the event loop (asyncio's own
    256 KB is never lowered). At 16 KB a copier woke for every 16 messages, and each wake-up's fixed
    work was paid 16 times as often as with 1 MB receives (its CPU per message: 31.5 -> 23.3 us,
    alternating pairs). Plain TCP only: over TLS asyncio's SSL protocol sizes each receive itself
    (256 KB), and widening that too measured no gain (a 16 KB subscriber's CPU per message, three
    alternating pairs: 32.5/30.9, 39.9/50.6, 31.0/34.4 us)."""
    if getattr(transport, "max_size", size) < size:
        transport.max_size = size  # type: ignore[attr-defined]


def install() -> None:
    """Every nats-py connection of this process opened from now on reads through `ChunkReader`."""
    client_module: Any = nats.aio.client
    if client_module.TcpTransport is not ChunkTransport:
        client_module.TcpTransport = ChunkTransport
