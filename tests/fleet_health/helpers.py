"""A scripted advisory history with hand-computed tables, and helpers to put it on a stream."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from collections.abc import Sequence
from typing import Any

from nats.aio.client import Client

from replicator.fleet_health.cli import add_arguments, run_from_args
from replicator.fleet_health.connection import NatsConnection, connect
from replicator.fleet_health.jetstream import Columns, RangeReader
from replicator.fleet_health.summary import DEFAULT_BUCKET, SUMMARY_KEY

T0 = 1_700_000_000
NOW = T0 + 10_000
SUBJECT = "sr.advisory.cmdb"

# (replicator, value, event, timestamp offset, seen offset), in the order the advisories arrive.
HISTORY: list[tuple[str, str, str, int, int]] = [
    ("dc1", "n1", "new", 0, 0),
    ("dc1", "n2", "new", 10, 10),
    ("dc1", "n3", "new", 20, 20),
    ("dc2", "n1", "new", 30, 30),
    ("edge/west 1", "n5", "new", 50, 50),
    ("edge/west 1", "n6", "new", 60, 60),
    ("edge/west 1", "n7", "new", 70, 70),
    ("dc2", "n1", "timeout", 400, 100),
    ("dc2", "n1", "timeout", 500, 100),  # still timed out: the run goes on from 400
    ("dc1", "n1", "timeout", 600, 300),
    ("dc1", "n2", "timeout", 700, 400),
    ("dc2", "n4", "timeout", 800, 100),  # never announced as new
    ("dc1", "n1", "recover", 900, 900),
    ("edge/west 1", "n6", "timeout", 1000, 700),
    ("dc2", "n1", "recover", 1000, 1000),
    ("edge/west 1", "n7", "timeout", 1300, 1000),
    ("edge/west 1", "n7", "recover", 1300, 1300),  # same second: the stream sequence orders them
    ("edge/west 1", "n6", "recover", 1500, 1500),
    ("dc1", "n1", "timeout", 2000, 1700),  # still timed out at NOW
    ("dc1", "n2", "expire", 3700, 400),
    ("edge/west 1", "n5", "expire", 5000, 50),
    ("edge/west 1", "n5", "new", 6000, 6000),  # came back after expiring
    ("edge/west 1", "n6", "timeout", 1200, 700),  # arrives last, belongs between 1000 and 1500
]

# The current id and the previous release's, both valid (advisory streams outlive upgrades).
SCHEMA_IDS = ("https://choria.io/schemas/sr/v1/age_advisory.json", "stream-replicator/v1/age_advisory")

MALFORMED: list[bytes] = [
    b"not json at all",
    json.dumps(
        {
            **{"$schema": "stream-replicator/v1/age_advisory"},
            "event_id": "x1",
            "event": "reboot",
            "inspect": "sender",
            "value": "n1",
            "age": 1,
            "seen": T0,
            "replicator": "dc1",
            "topic": "t",
            "timestamp": T0,
        }
    ).encode(),
    json.dumps(
        {
            "$schema": "stream-replicator/v1/age_advisory",
            "event_id": "x2",
            "event": "new",
            "inspect": "sender",
            "value": "n9",
            "age": 1,
            "seen": T0,
            "topic": "t",
            "timestamp": T0,
        }
    ).encode(),  # no replicator
    json.dumps(
        {
            "$schema": "io.choria.sr.v2.age_advisory",
            "event_id": "x3",
            "event": "new",
            "inspect": "sender",
            "value": "n9",
            "age": 1,
            "seen": T0,
            "replicator": "dc1",
            "topic": "t",
            "timestamp": T0,
        }
    ).encode(),
    json.dumps(
        {
            "$schema": "stream-replicator/v1/age_advisory",
            "event_id": "x4",
            "event": "new",
            "inspect": "sender",
            "value": "n9",
            "age": 1,
            "seen": T0,
            "replicator": "dc1",
            "topic": "t",
            "timestamp": "yesterday",
        }
    ).encode(),
]


def advisory(index: int) -> bytes:
    replicator, value, event, ts, seen = HISTORY[index]
    return json.dumps(
        {
            "$schema": SCHEMA_IDS[index % 2],
            "event_id": f"ev-{index}",
            "event": event,
            "inspect": "sender",
            "value": value,
            "age": ts - seen,
            "seen": T0 + seen,
            "replicator": replicator,
            "topic": "acme.cmdb",
            "timestamp": T0 + ts,
        }
    ).encode()


def scripted_messages() -> list[bytes]:
    """The history with duplicates (same event_id, later) and malformed messages interleaved."""
    out = [advisory(i) for i in range(7)]
    out.append(MALFORMED[0])
    out += [advisory(i) for i in range(7, 13)]
    out += [advisory(2), MALFORMED[1]]
    out += [advisory(i) for i in range(13, 19)]
    out += [MALFORMED[2], advisory(9)]
    out += [advisory(i) for i in range(19, 22)]
    out += [MALFORMED[3], MALFORMED[4], advisory(22), advisory(22)]
    return out


MESSAGES = scripted_messages()
VALID, DUPLICATES, BAD = len(HISTORY), 3, len(MALFORMED)
assert len(MESSAGES) == VALID + DUPLICATES + BAD

# The hand-computed `nodes` table at NOW: replicator, value, state, first_seen, last_event,
# last_event_time, timeouts, recoveries, expiries, downtime_seconds, timeout_since.
EXPECTED_NODES = [
    # timeouts 600..900 (300 s) and 2000..NOW (8000 s)
    ("dc1", "n1", "timeout", T0 + 0, "timeout", T0 + 2000, 2, 1, 0, 8300, T0 + 2000),
    # timeout 700 until the expiry at 3700
    ("dc1", "n2", "expired", T0 + 10, "expire", T0 + 3700, 1, 0, 1, 3000, None),
    ("dc1", "n3", "healthy", T0 + 20, "new", T0 + 20, 0, 0, 0, 0, None),
    # 400..1000: the second timeout does not restart the clock
    ("dc2", "n1", "healthy", T0 + 30, "recover", T0 + 1000, 2, 1, 0, 600, None),
    # first seen (100) comes from the advisory's `seen`; timed out since 800
    ("dc2", "n4", "timeout", T0 + 100, "timeout", T0 + 800, 1, 0, 0, 9200, T0 + 800),
    ("edge/west 1", "n5", "healthy", T0 + 50, "new", T0 + 6000, 0, 0, 1, 0, None),
    # 1000..1500 with the late timeout at 1200 inside it
    ("edge/west 1", "n6", "healthy", T0 + 60, "recover", T0 + 1500, 2, 1, 0, 500, None),
    ("edge/west 1", "n7", "healthy", T0 + 70, "recover", T0 + 1300, 1, 1, 0, 0, None),
]
NODE_FIELDS = (
    "replicator",
    "value",
    "state",
    "first_seen",
    "last_event",
    "last_event_time",
    "timeouts",
    "recoveries",
    "expiries",
    "downtime_seconds",
    "timeout_since",
)

# replicator, nodes, healthy, timeout, expired, availability
EXPECTED_SITES = [
    ("dc1", 3, 1, 1, 1, 0.5),
    ("dc2", 2, 1, 1, 0, 0.5),
    ("edge/west 1", 3, 3, 0, 0, 1.0),
]
EXPECTED_FLEET = {"sites": 3, "nodes": 8, "healthy": 5, "timeout": 2, "expired": 1, "unknown": 0,
                  "availability": 5 / 7}


def node_tuples(rows: Sequence[object]) -> list[tuple[object, ...]]:
    return sorted(tuple(getattr(r, f) for f in NODE_FIELDS) for r in rows)  # type: ignore[misc]


def site_tuples(rows: Sequence[dict[str, object]]) -> list[tuple[object, ...]]:
    fields = ("replicator", "nodes", "healthy", "timeout", "expired", "availability")
    return [tuple(r[f] for f in fields) for r in rows]


async def publish(nc: Client, payloads: Sequence[bytes], subject: str = SUBJECT) -> None:
    """Through JetStream, acknowledged. No `Nats-Msg-Id`: the server would drop the duplicates we want."""
    js = nc.jetstream()
    for payload in payloads:
        await js.publish(subject, payload)


async def fill_advisories(connection: NatsConnection, stream: str = "ADVISORIES") -> None:
    """The scripted advisories (`MESSAGES`) in a new stream, over the job's own way to connect."""
    nc = await connect(connection, name="fill")
    try:
        await nc.jetstream().add_stream(name=stream, subjects=["sr.advisory.>"])
        await publish(nc, MESSAGES)
    finally:
        await nc.close()


async def read_summary(
    url: NatsConnection | str, bucket: str = DEFAULT_BUCKET, credentials: str | None = None
) -> dict[str, Any]:
    """The job's summary as the KV bucket holds it."""
    nc = await connect(url, credentials, name="fleet-health-reader")
    try:
        kv = await nc.jetstream().key_value(bucket)
        entry = await kv.get(SUMMARY_KEY)
        return dict(json.loads(entry.value or b"{}"))
    finally:
        await nc.close()


async def read_all(nc: Client, stream: str, start: int, end: int, *, batch: int = 1000) -> Columns:
    """One range in one process, read whole: what a test compares the Spark read with."""
    result = Columns()
    async with RangeReader(nc, stream, start, end, batch=batch) as reader:
        while (chunk := await reader.next_chunk()) is not None:
            result.sequence += chunk.sequence
            result.subject += chunk.subject
            result.time_us += chunk.time_us
            result.headers += chunk.headers
            result.data += chunk.data
    return result


def run_cli(arguments: list[str]) -> tuple[int, str, str]:
    """The fleet-health command line in-process: its exit status, stdout and stderr."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = run_from_args(parser.parse_args(arguments))
    return status, out.getvalue(), err.getvalue()


def fleet_resource(target: dict[str, Any], stream: str, output: str) -> dict[str, Any]:
    """A StreamReplication with fleet health on `stream`, its target as given."""
    return {
        "metadata": {"name": "fleet", "namespace": "replication"},
        "spec": {
            "topic": "acme.cmdb",
            "source": {"url": "nats://source.example.net:4222"},
            "target": target,
            "advisory": {"subject": SUBJECT},
            "fleetHealth": {"stream": stream, "output": output, "executor": {"instances": 1, "cores": 2}},
        },
    }
