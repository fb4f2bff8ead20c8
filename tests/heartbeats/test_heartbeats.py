"""Heartbeats (the Go tool's 0.8 feature): JetStream publishes per subject with the unix time as body,
`Choria-SR-Originator` / `Choria-SR-Subject` and the configured headers (a subject's own win),
each subject at its own interval; counted for the metrics."""

from __future__ import annotations

import asyncio
import random
import socket
import time

import pytest
from nats.aio.client import Client
from nats.js.api import StreamConfig

from replicator.config import parse_config
from replicator.demo.local_nats import LocalNatsServer
from replicator.heartbeats import Heartbeats, heartbeat_profile
from tests.support.faults import read_stream

pytestmark = pytest.mark.timeout(60)


async def test_heartbeats_per_subject_intervals_headers_and_counts(source_server: LocalNatsServer,
                                                                   source_nc: Client) -> None:
    await source_nc.jetstream().add_stream(StreamConfig(name="MONITOR", subjects=["monitor.>"]))
    config = parse_config({"name": "US-EAST", "streams": [], "heartbeats": {
        "url": f"{source_server.url}?connect_timeout=2s", "interval": "150ms",
        "headers": {"from": "us-east", "team": "fleet"},
        "subjects": [{"subject": "monitor.fast"},
                     {"subject": "monitor.slow", "interval": "1s", "headers": {"team": "ops", "noop": "true"}}],
    }}, "sr.yaml")
    assert config.heartbeats is not None
    beats = Heartbeats(config.heartbeats, heartbeat_profile(config, "US-EAST"), "US-EAST")
    started = int(time.time())
    task = asyncio.ensure_future(beats.run())
    try:
        for _ in range(60):
            if beats.published["monitor.slow"] >= 1 and beats.published["monitor.fast"] >= 4:
                break
            await asyncio.sleep(0.1)
    finally:
        beats.stop()
        await asyncio.wait_for(task, 10)
    msgs = await read_stream(source_nc, "MONITOR")
    by_subject = {s: [m for m in msgs if m.subject == s] for s in ("monitor.fast", "monitor.slow")}
    assert len(by_subject["monitor.fast"]) > len(by_subject["monitor.slow"]) >= 1
    host = socket.gethostname()
    for m in msgs:
        assert started <= int(m.data) <= int(time.time())
        assert m.headers["Choria-SR-Originator"] == host and m.headers["Choria-SR-Subject"] == m.subject
        assert m.headers["from"] == "us-east"
    assert {(m.headers["team"], m.headers.get("noop")) for m in by_subject["monitor.slow"]} == {("ops", "true")}
    assert {(m.headers["team"], m.headers.get("noop")) for m in by_subject["monitor.fast"]} == {("fleet", None)}
    samples = {(name, tuple(sorted(labels.items()))): value for name, labels, value in beats.samples()}
    fast = (("replicator", "US-EAST"), ("subject", "monitor.fast"))
    assert samples[("heartbeat_published_count", fast)] == len(by_subject["monitor.fast"])
    assert samples[("heartbeat_published_error_count", fast)] == 0
    assert samples[("heartbeat_publish_time_count", fast)] == len(by_subject["monitor.fast"])
    assert samples[("heartbeat_paused", (("hostname", host), ("replicator", "US-EAST")))] == 0
    assert beats.profile.base_name == "SR_US-EAST_HB"  # the Go tool's election key


async def test_a_heartbeat_that_cannot_be_stored_counts_an_error(source_server: LocalNatsServer) -> None:
    """No stream captures the subject: the publish fails, is counted as an error and not as published
    (the Go tool counts it as both)."""
    config = parse_config({"topics": {}, "heartbeats": {"url": source_server.url, "interval": "100ms",
                                                        "subjects": [{"subject": "nowhere.beat"}]}}, "sr.yaml")
    assert config.heartbeats is not None
    beats = Heartbeats(config.heartbeats, heartbeat_profile(config, "site"), "site")
    task = asyncio.ensure_future(beats.run())
    try:
        for _ in range(50):
            if beats.errors["nowhere.beat"]:
                break
            await asyncio.sleep(0.1)
    finally:
        beats.stop()
        await asyncio.wait_for(task, 10)
    assert beats.errors["nowhere.beat"] >= 1 and beats.published["nowhere.beat"] == 0


async def test_stop_returns_while_publishing_flat_out(source_server: LocalNatsServer, source_nc: Client) -> None:
    """Stopped at random moments while 20 subjects publish every millisecond, so a cancellation
    often lands as a publish ack arrives (Python 3.11's `wait_for` then loses it): every stop
    returns. Before the fix about a third of such stops hung for ever."""
    await source_nc.jetstream().add_stream(StreamConfig(name="MONITOR", subjects=["monitor.>"]))
    config = parse_config({"name": "BUSY", "streams": [], "heartbeats": {
        "url": source_server.url, "interval": "1ms",
        "subjects": [{"subject": f"monitor.s{i}"} for i in range(20)]}}, "sr.yaml")
    assert config.heartbeats is not None
    rng = random.Random(7)
    for _ in range(60):
        beats = Heartbeats(config.heartbeats, heartbeat_profile(config, "BUSY"), "BUSY")
        task = asyncio.ensure_future(beats.run())
        for _ in range(1000):
            if sum(beats.published.values()) >= 50 or task.done():
                break
            await asyncio.sleep(0.005)
        await asyncio.sleep(rng.random() * 0.02)
        beats.stop()
        done, _ = await asyncio.wait([task], timeout=5)
        assert done, f"stop did not return after {sum(beats.published.values())} heartbeats"
        task.result()
