"""Every header nats-server interprets, in real source messages, copied by both modes into a plain
target and into one that allows the features: nothing stalls, and each header is stripped,
renamed or honoured as the policy table says (docs/reliability.md, "Header policy")."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

import pytest
from nats.aio.client import Client

from replicator.copier.headers import RENAMED
from replicator.demo.local_nats import LocalNatsServer
from tests.copier.helpers import InProcess, make_stream, profile_for, topic_config
from tests.support.faults import StoredMsg, read_stream, wait_count

SCALED = {"workers": 2, "queue_group": "hdr_grp", "name": None}
SOURCE_FEATURES = {"allow_msg_ttl": True, "allow_rollup_hdrs": True, "allow_atomic": True, "allow_msg_schedules": True}
TARGET_FEATURES = {"allow_msg_ttl": True, "allow_rollup_hdrs": True, "allow_atomic": True}


async def _request(nc: Client, subject: str, data: bytes, headers: dict[str, str]) -> bytes:
    reply = await nc.request(subject, data, headers=headers, timeout=5)
    assert b'"error"' not in reply.data, (subject, headers, reply.data)
    return reply.data


async def publish_control_headers(nc: Client) -> int:
    """One source message per control header (and a few plain ones behind them); the count."""
    js = nc.jetstream()
    await make_stream(nc, "HDRS", ["hdr.>"], **SOURCE_FEATURES)
    await make_stream(nc, "COUNT", ["cnt.>"], allow_msg_counter=True)
    # An atomic batch of two: both stored with their Nats-Batch-* headers.
    await _request(nc, "hdr.batch", b"b1", {"Nats-Batch-Id": "batch-1", "Nats-Batch-Sequence": "1"})
    await _request(nc, "hdr.batch", b"b2", {"Nats-Batch-Id": "batch-1", "Nats-Batch-Sequence": "2",
                                            "Nats-Batch-Commit": "1"})
    await js.publish("hdr.msgid", b"own id", headers={"Nats-Msg-Id": "agent-7"})
    await js.publish("hdr.expect", b"cas", headers={"Nats-Expected-Stream": "HDRS",
                                                    "Nats-Expected-Last-Subject-Sequence": "0"})
    await js.publish("hdr.ttl", b"expires", headers={"Nats-TTL": "1h"})
    await js.publish("hdr.roll", b"latest", headers={"Nats-Rollup": "sub"})
    await js.publish("hdr.api", b"level", headers={"Nats-Required-Api-Level": "1"})
    # A schedule that never fires, and the output of one that fires once, now.
    await js.publish("hdr.sched.later", b"def", headers={"Nats-Schedule": "@at 2099-01-01T00:00:00Z",
                                                          "Nats-Schedule-Target": "hdr.out.later"})
    soon = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    await js.publish("hdr.sched.once", b"fired", headers={"Nats-Schedule": f"@at {soon}",
                                                           "Nats-Schedule-Target": "hdr.out.once"})
    # The header set nats-server 2.15.1 writes on a subject-delete marker (seen on a stream with
    # subject_delete_marker_ttl: 1m); published here, since a real one needs the source's max_age
    # to expire messages, and then the marker with them.
    await js.publish("hdr.marker", b"", headers={"Nats-Marker-Reason": "MaxAge", "Nats-TTL": "1m0s",
                                                  "Nats-Rollup": "sub"})
    for i in range(5):
        await js.publish("hdr.tail", f"tail {i}".encode())
    for step in ("+1", "+2", "+3"):
        await js.publish("cnt.a", b"", headers={"Nats-Incr": step})
    for _ in range(50):  # the one-shot schedule fires (its output stays, its definition is purged)
        msgs = [m for m in await read_stream(nc, "HDRS") if m.subject == "hdr.out.once"]
        if msgs:
            break
        await asyncio.sleep(0.1)
    assert msgs, "the one-shot schedule never fired"
    return len(await read_stream(nc, "HDRS"))


def _by_subject(msgs: list[StoredMsg]) -> dict[str, list[StoredMsg]]:
    out: dict[str, list[StoredMsg]] = {}
    for m in msgs:
        out.setdefault(m.subject, []).append(m)
    return out


@pytest.mark.timeout(90)
@pytest.mark.parametrize("target_kind", ["plain", "featured"])
@pytest.mark.parametrize("mode", ["ordered", "scaled"])
async def test_control_headers_never_stall_and_follow_the_policy(
    mode: str, target_kind: str, source_server: LocalNatsServer, target_server: LocalNatsServer,
    source_nc: Client, target_nc: Client,
) -> None:
    featured = target_kind == "featured"
    total = await publish_control_headers(source_nc)
    await make_stream(target_nc, "HDRS_COPY", ["hdr.>"], **(TARGET_FEATURES if featured else {}))
    await make_stream(target_nc, "COUNT_COPY", ["cnt.>"], **({"allow_msg_counter": True} if featured else {}))
    # Another writer's message on the roll-up's subject: purged by it where roll-ups are allowed.
    await target_nc.jetstream().publish("hdr.roll", b"someone else's")
    extra: dict[str, Any] = SCALED if mode == "scaled" else {}
    hdrs = profile_for(topic_config(source_server.url, target_server.url, topic="hdr.>", source_stream="HDRS",
                                    target_stream="HDRS_COPY", **{"name": "hdr", **extra}))
    count_extra = {**extra, "queue_group": "cnt_grp"} if extra else {"name": "cnt"}
    cnt = profile_for(topic_config(source_server.url, target_server.url, topic="cnt.>", source_stream="COUNT",
                                   target_stream="COUNT_COPY", **count_extra))
    want = total + (0 if featured else 1)
    async with InProcess(hdrs), InProcess(cnt):
        assert await wait_count(target_nc, "HDRS_COPY", want, 30) is not None, "a control header stalled the copy"
        assert await wait_count(target_nc, "COUNT_COPY", 3, 30) is not None, "a counter increment stalled the copy"
        await asyncio.sleep(0.5)
    copies = await read_stream(target_nc, "HDRS_COPY")
    assert len(copies) == want
    by = _by_subject(copies)
    mine = [m for m in copies if "Stream-Replicator-Source" in m.headers]
    if mode == "ordered":
        assert [m.source_seq for m in mine] == sorted(m.source_seq for m in mine)
    for m in mine:
        assert not [k for k in m.headers if k.startswith(("Nats-Batch-", "Nats-Required-Api-Level"))], m.headers
        assert [k for k in m.headers if k.startswith("Nats-Expected-")] in ([], ["Nats-Expected-Last-Msg-Id"])
    in_order = sorted if mode == "scaled" else list  # scaled workers share the durable: any order
    assert in_order(m.data for m in by["hdr.batch"]) == [b"b1", b"b2"]
    assert by["hdr.msgid"][0].headers[RENAMED + "Nats-Msg-Id"] == "agent-7"
    assert by["hdr.msgid"][0].headers["Nats-Msg-Id"].endswith(f":{by['hdr.msgid'][0].source_seq}")
    ttl = by["hdr.ttl"][0].headers
    assert (ttl.get("Nats-TTL"), ttl.get(RENAMED + "Nats-TTL")) == (("1h", None) if featured else (None, "1h"))
    roll = by["hdr.roll"]
    assert [m.data for m in roll] == ([b"latest"] if featured else [b"someone else's", b"latest"])
    assert ("Nats-Rollup" in roll[-1].headers) is featured
    for subject in ("hdr.sched.later", "hdr.out.once"):
        headers = by[subject][0].headers
        assert not [k for k in headers if k.startswith("Nats-Schedule")], headers
    assert by["hdr.sched.later"][0].headers[RENAMED + "Nats-Schedule"].startswith("@at 2099")
    assert by["hdr.out.once"][0].headers[RENAMED + "Nats-Scheduler"] == "hdr.sched.once"
    marker = by["hdr.marker"][0].headers
    assert {k: marker.get(RENAMED + k) for k in ("Nats-Marker-Reason", "Nats-TTL", "Nats-Rollup")} == {
        "Nats-Marker-Reason": "MaxAge", "Nats-TTL": "1m0s", "Nats-Rollup": "sub"}
    assert in_order(m.data for m in by["hdr.tail"]) == [f"tail {i}".encode() for i in range(5)]
    counters = await read_stream(target_nc, "COUNT_COPY")
    totals = [json.loads(m.data)["val"] for m in counters]
    if featured:  # the target re-applied the increments and computed its own totals
        assert sorted(totals) == ["1", "3", "6"] and all("Nats-Incr" in m.headers for m in counters)
    else:  # the source's totals, the increments kept as information
        assert sorted(totals) == ["1", "3", "6"] and all(RENAMED + "Nats-Incr" in m.headers for m in counters)
