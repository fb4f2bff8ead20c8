"""A TCP proxy for fault injection and latency: between the replicator and a NATS server.

Modes: pass-through with optional one-way `delay`; `cut()` closes every connection and refuses
new ones until `restore()`; `half_open()` keeps sockets open but silently stops forwarding, the
failure that only heartbeats detect (new connections are accepted and go nowhere too). As a
process of its own: `python -m tests.support.tcp_proxy --upstream PORT --delay S` (prints its URL
once listening).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

from replicator.demo.local_nats import free_port


@dataclass
class TcpProxy:
    upstream_port: int
    delay: float = 0.0  # seconds added in each direction (RTT adds twice this)
    port: int = field(default_factory=free_port)
    host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.refusing = False
        self.blackhole = False

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        self._close_all()
        for task in list(self._tasks):
            task.cancel()

    def cut(self) -> None:
        """Close every connection and refuse new ones (a link down)."""
        self.refusing = True
        self._close_all()

    def half_open(self) -> None:
        """Keep connections open but forward nothing (a silent network partition)."""
        self.blackhole = True

    def restore(self) -> None:
        """The link works again for new connections. Connections that were half-open are dead (their
        peer state is gone, as after a NAT timeout): resuming them would deliver a byte stream with a
        hole in it, which no real network does, so they are closed."""
        if self.blackhole:
            self._close_all()
        self.refusing = False
        self.blackhole = False

    def _close_all(self) -> None:
        for writer in list(self._conns):
            with contextlib.suppress(Exception):
                writer.transport.abort()
        self._conns.clear()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self.refusing:
            client_w.transport.abort()
            return
        try:
            up_r, up_w = await asyncio.open_connection(self.host, self.upstream_port)
        except (OSError, asyncio.CancelledError):
            # Cancelled: the loop is ending mid-connect. Ending quietly, because Python 3.11's
            # stream server logs a cancelled handler's "exception" with a traceback.
            client_w.transport.abort()
            return
        self._conns.update((client_w, up_w))
        for reader, writer in ((client_r, up_w), (up_r, client_w)):
            task = asyncio.ensure_future(self._pipe(reader, writer))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, chunk = await queue.get()
                if not chunk:
                    return  # end of stream marker
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not self.blackhole:
                    try:
                        writer.write(chunk)
                        await writer.drain()
                    except (ConnectionError, OSError):
                        return  # the other side is gone: the reading side ends this direction

        sender = asyncio.ensure_future(deliver())
        try:
            while True:
                chunk = await reader.read(256 * 1024)
                if not chunk:
                    break
                if self.blackhole:
                    continue
                queue.put_nowait((time.monotonic() + self.delay, chunk))
        except (ConnectionError, OSError):
            pass  # the link was cut (by us or a peer): nothing to forward any more
        finally:
            # Deliver what was read before the peer closed (bounded), then close this direction.
            queue.put_nowait((0.0, b""))
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(sender), self.delay + 1.0)
            sender.cancel()
            with contextlib.suppress(Exception):
                writer.transport.abort()
            self._conns.discard(writer)


class ThreadedProxy:
    """The proxy on its own event loop thread, so it can sit beside a blocking loop (or another process)."""

    def __init__(self, upstream_port: int, delay: float = 0.0) -> None:
        self.proxy = TcpProxy(upstream_port, delay)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    @property
    def url(self) -> str:
        return self.proxy.url

    def start(self) -> ThreadedProxy:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.proxy.start(), self.loop).result(10)
        return self

    def call(self, name: str) -> None:
        self.loop.call_soon_threadsafe(getattr(self.proxy, name))

    def cut(self) -> None:
        self.call("cut")

    def half_open(self) -> None:
        self.call("half_open")

    def restore(self) -> None:
        self.call("restore")

    def set_delay(self, delay: float) -> None:
        """Latency from now on, for new and open connections (seconds each way)."""
        self.loop.call_soon_threadsafe(setattr, self.proxy, "delay", delay)

    @property
    def connections(self) -> int:
        """Open client-side plus upstream sockets: tells whether a client has given up on the link."""
        return len(self.proxy._conns)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.proxy.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


async def _serve(upstream_port: int, delay: float, port: int) -> None:
    proxy = await TcpProxy(upstream_port, delay, port).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    print(proxy.url, flush=True)
    await stop.wait()
    await proxy.stop()


def main(argv: list[str] | None = None) -> int:
    """The proxy as a process of its own (`python -m tests.support.tcp_proxy`): the benchmarks'
    latency must not share an interpreter, and its pauses, with the process that measures."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--upstream", type=int, required=True, help="port of the server on 127.0.0.1")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds added in each direction")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0: a free one)")
    args = parser.parse_args(argv)
    asyncio.run(_serve(args.upstream, args.delay, args.port or free_port()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
