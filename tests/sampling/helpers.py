"""Helpers for the sampling tests: a controllable clock, profiles built from dicts, the schema."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from replicator.config import Profile, parse_config
from replicator.observe.metrics import Metrics, WorkerMetrics
from replicator.sampling.advisories import schema


class FakeClock:
    """Wall-clock time the test moves by hand: sampling decisions become exact."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def make_profile(state_dir: Path | None = None, name: str = "cmdb", **topic: Any) -> Profile:
    settings: dict[str, Any] = {
        "topic": "acme.cmdb",
        "source_url": "nats://127.0.0.1:4222",
        "target_url": "nats://127.0.0.1:4223",
        "inspect": "sender",
        "age": 10,
    }
    settings.update(topic)
    doc: dict[str, Any] = {"topics": {name: settings}}
    if state_dir is not None:
        doc["state_dir"] = str(state_dir)
    return Profile(parse_config(doc), name)


def worker_metrics(worker: str = "w_0") -> WorkerMetrics:
    return Metrics().worker("test", worker)


def body(sender: str | None = None, **extra: Any) -> bytes:
    doc = dict(extra)
    if sender is not None:
        doc["sender"] = sender
    return json.dumps(doc).encode()


def validate_advisory(doc: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator(schema()).validate(doc)


async def eventually(
    check: Callable[[], bool | Awaitable[bool]], within: float = 10.0, step: float = 0.02
) -> float:
    """Poll until `check` holds; returns the seconds it took (fails the test after `within`)."""
    started = time.monotonic()
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return time.monotonic() - started
        if time.monotonic() - started > within:
            pytest.fail(f"condition not met within {within}s")
        await asyncio.sleep(step)


def value(metric: Any) -> float:
    """Current value of a labelled prometheus counter or gauge."""
    return float(metric._samples()[0].value)  # what a scrape reads, function-backed gauges too
