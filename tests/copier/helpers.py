"""Shared helpers for data-plane tests: configs, running a replicator in-process or as a process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from nats.aio.client import Client
from nats.js.api import StreamConfig

from replicator.config import Profile, parse_config
from replicator.copier.provenance import PROVENANCE, parse_provenance, stream_identity, writer_id
from replicator.service.runner import Replicator


def topic_config(source_url: str, target_url: str, **overrides: Any) -> dict[str, Any]:
    topic = {"topic": "fleet.>", "source_url": source_url, "target_url": target_url, "name": "sr"}
    topic = {k: v for k, v in {**topic, **overrides}.items() if v is not None}
    return {"topics": {"fleet": topic}}


def profile_for(config: dict[str, Any], topic: str = "fleet", instance: str | None = None) -> Profile:
    return Profile(parse_config(config, "test.yaml"), topic, instance=instance, source="test.yaml")


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path


async def make_stream(nc: Client, name: str = "FLEET", subjects: Iterable[str] = ("fleet.>",), **kw: Any) -> None:
    await nc.jetstream().add_stream(StreamConfig(name=name, subjects=list(subjects), **kw))


WRITE_PATHS = ("batch", "message")  # how ordered mode writes: fast-ingest batches, or per message


async def make_target(nc: Client, path: str, name: str = "FLEET", subjects: Iterable[str] = ("fleet.>",),
                      **kw: Any) -> None:
    """A target stream for a write path: with `allow_batched` (batch) or without (message)."""
    await make_stream(nc, name, subjects, allow_batched=True if path == "batch" else None, **kw)


async def writer_of(nc: Client, name: str, stream: str = "FLEET") -> str:
    """The writer id that replicator `name` gives the copies of `stream` as it is now."""
    created = json.loads((await nc.request(f"$JS.API.STREAM.INFO.{stream}", b"")).data)["created"]
    return writer_id(stream, stream_identity(created), name)


def write_path(replicator: Replicator, worker: str = "sr_0") -> str | None:
    """The path the worker reports in `stream_replicator_write_path`."""
    for path in WRITE_PATHS:
        value = replicator.metrics.registry.get_sample_value(
            "stream_replicator_write_path", {"name": worker.rsplit("_", 1)[0], "worker": worker, "path": path})
        if value == 1:
            return path
    return None


async def publish_many(nc: Client, count: int, *, start: int = 0, subject: str = "fleet.n{i}",
                       size: int = 32, headers: dict[str, str] | None = None) -> None:
    """Pipelined JetStream publishes with the payload carrying its index, so order can be checked."""
    js = nc.jetstream()
    futures = []
    for i in range(start, start + count):
        body = f"{i:08d}".encode().ljust(size, b".")
        futures.append(await js.publish_async(subject.format(i=i % 100), body, headers=headers))
        if len(futures) >= 2000:
            await asyncio.gather(*futures)
            futures.clear()
    await asyncio.gather(*futures)


async def read_all(nc: Client, stream: str) -> list[Any]:
    """Every message in the target stream, in stream order (fast: direct consumer fetch)."""
    js = nc.jetstream()
    info = await js.stream_info(stream)
    total = info.state.messages
    if total == 0:
        return []
    psub = await js.pull_subscribe(">", durable=None, stream=stream)
    out: list[Any] = []
    while len(out) < total:
        msgs = await psub.fetch(min(1000, total - len(out)), timeout=5)
        for m in msgs:
            await m.ack()
        out.extend(msgs)
    await psub.unsubscribe()
    return out


def indices(msgs: list[Any]) -> list[int]:
    return [int(m.data[:8]) for m in msgs]


def source_seqs(msgs: list[Any]) -> list[int]:
    return [parse_provenance(m.headers[PROVENANCE]).seq for m in msgs]  # type: ignore[union-attr]


async def wait_for_count(nc: Client, stream: str, count: int, timeout: float = 30.0) -> int:
    js = nc.jetstream()
    deadline = time.monotonic() + timeout
    n = -1
    while time.monotonic() < deadline:
        try:
            n = (await js.stream_info(stream)).state.messages
        except Exception:
            n = -1
        if n >= count:
            return n
        await asyncio.sleep(0.1)
    return n


class InProcess:
    """A Replicator running as a task of the test's loop."""

    def __init__(self, profile: Profile, monitor_port: int | None = None) -> None:
        self.replicator = Replicator(profile, monitor_port=monitor_port)
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Replicator:
        self.task = asyncio.ensure_future(self.replicator.run())
        return self.replicator

    async def __aexit__(self, *exc: object) -> None:
        self.replicator.stop()
        assert self.task is not None
        await asyncio.wait_for(self.task, 30)


def spawn(config_path: Path, topic: str = "fleet", *extra: str, instance: str | None = None,
          log_path: Path | None = None) -> subprocess.Popen[bytes]:
    """The real console entry point as a child process (for kill -9 and multi-process tests)."""
    env = dict(os.environ)
    if instance:
        env["SR_INSTANCE"] = instance
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL
    return subprocess.Popen(
        [sys.executable, "-m", "replicator", "--config", str(config_path), "--topic", topic, *extra],
        stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )


def stop(proc: subprocess.Popen[bytes], kill: bool = False, timeout: float = 30) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
    return proc.wait(timeout=timeout)
