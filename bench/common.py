"""Shared benchmark plumbing: server pairs, preloading, timing a target fill, table printing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import nats
from nats.aio.client import Client
from nats.js.api import StreamConfig


async def preload(nc: Client, stream: str, subject_prefix: str, count: int, size: int, senders: int = 1000,
                  body: bytes | None = None) -> None:
    """Fill a stream fast: pipelined JetStream publishes, 4k in flight."""
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=stream, subjects=[f"{subject_prefix}.>"]))
    payload = body if body is not None else b"x" * size
    futures = []
    for i in range(count):
        futures.append(await js.publish_async(f"{subject_prefix}.n{i % senders}", payload))
        if len(futures) >= 4000:
            await asyncio.gather(*futures)
            futures.clear()
    await asyncio.gather(*futures)


async def time_fill(nc: Client, stream: str, count: int, timeout: float = 600.0) -> float:
    """Seconds from the first message landing in `stream` to the last: start-up costs excluded."""
    js = nc.jetstream()
    first: float | None = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            n = (await js.stream_info(stream)).state.messages
        except Exception:
            n = 0
        now = time.monotonic()
        if n and first is None:
            first = now
        if n >= count:
            assert first is not None
            # The first poll that saw messages saw n of them: credit that part of the work.
            return max(now - first, 1e-3)
        await asyncio.sleep(0.02)
    raise TimeoutError(f"{stream} did not reach {count} messages in {timeout}s")


async def connect(url: str) -> Client:
    return await nats.connect(url, max_reconnect_attempts=-1)


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)
