"""Shared benchmark plumbing: server pairs, preloading, timing a target fill, table printing."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import nats
import yaml
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


async def time_progress(progress: Callable[[], Awaitable[int]], count: int, timeout: float = 600.0,
                        on_first: Callable[[], None] | None = None) -> float:
    """Seconds from the first sign of progress to `count`: process start-up costs excluded."""
    first: float | None = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            n = await progress()
        except Exception:
            n = 0
        now = time.monotonic()
        if n and first is None:
            first = now
            if on_first is not None:
                on_first()
        if n >= count:
            assert first is not None
            return max(now - first, 1e-3)
        await asyncio.sleep(0.02)
    raise TimeoutError(f"progress did not reach {count} in {timeout}s")


async def time_fill(nc: Client, stream: str, count: int, on_first: Callable[[], None] | None = None) -> float:
    """Seconds from the first message landing in `stream` to the last."""
    js = nc.jetstream()

    async def landed() -> int:
        return int((await js.stream_info(stream)).state.messages)

    return await time_progress(landed, count, on_first=on_first)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux /proc), 0.0 where unknown.

    On a shared machine a rate moves with everyone else's load; the CPU a copy costs moves less."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


@contextlib.contextmanager
def command_process(args: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    """The real `stream-replicator ARGS` command line as a child process, stopped with SIGTERM."""
    proc = subprocess.Popen([sys.executable, "-m", "replicator", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(60)


@contextlib.contextmanager
def replicator_process(workdir: Path, label: str, topic: dict[str, Any]) -> Iterator[subprocess.Popen[bytes]]:
    """The real `stream-replicator` command as a child process, with `topic` as profile `bench`."""
    config = workdir / f"{label}.yaml"
    config.write_text(yaml.safe_dump({"topics": {"bench": topic}}))
    with command_process(["--config", str(config), "--topic", "bench"]) as proc:
        yield proc


@contextlib.contextmanager
def proxy_process(upstream_port: int, delay: float) -> Iterator[str]:
    """A latency proxy in front of a server, in a process of its own (`tests/support/tcp_proxy.py`):
    in the benchmark's own process it would share the interpreter (and its collector's pauses)
    with the measuring, and a case run after others would pay for their garbage. Yields its URL."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.tcp_proxy", "--upstream", str(upstream_port),
                             "--delay", str(delay)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().decode().strip()
        if not url:
            raise RuntimeError("the latency proxy did not start")
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


async def connect(url: str) -> Client:
    return await nats.connect(url, max_reconnect_attempts=-1)


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)
