"""What the scenarios share: StreamReplications as a user writes them, streams on real NATS servers,
and a steady trickle of messages so that rates and lag have something to show."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import nats

NS = "replication"
API_VERSION, KIND = "streamreplicator.io/v1alpha1", "StreamReplication"


def replication(name: str, source: str, target: str, stream: str, topic: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "engine": "replicator",
            "topic": topic,
            "source": {"url": source, "stream": stream},
            "target": {"url": target, "stream": f"{stream}_COPY"},
            **spec,
        },
    }


async def add_stream(url: str, name: str, subjects: list[str], **config: Any) -> None:
    nc = await nats.connect(url)
    try:
        await nc.jetstream().add_stream(name=name, subjects=subjects, **config)
    finally:
        await nc.close()


@contextlib.asynccontextmanager
async def trickle(url: str, subjects: list[str], per_second: float = 20,
                  headers: dict[str, str] | None = None) -> AsyncIterator[list[int]]:
    """Publish JSON messages round-robin over `subjects` until the block ends; yields [sent]."""
    nc = await nats.connect(url, max_reconnect_attempts=-1)
    js = nc.jetstream()
    sent = [0]

    async def run() -> None:
        while True:
            subject = subjects[sent[0] % len(subjects)]
            body = json.dumps({"n": sent[0], "sender": subject}).encode()
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                await js.publish(subject, body, headers={**(headers or {}), "Choria-Sender": subject}, timeout=2)
                sent[0] += 1
            await asyncio.sleep(1 / per_second)

    task = asyncio.create_task(run())
    try:
        yield sent
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await nc.close()
