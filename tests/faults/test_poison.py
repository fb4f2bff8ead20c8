"""Publish errors by class: a permanent one is poison (dead-lettered or skipped, counted, logged once
with its source sequence) and never holds up the messages behind it; one this release does not
know is retried, then reported stuck (metric, /readyz, `report`) until it goes through."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

from replicator.cli.report import report_row
from replicator.copier import failures, poison, scaled
from replicator.demo.local_nats import LocalNatsServer, free_port
from replicator.transport.jetstream import PublishError
from replicator.transport.streams import set_consumer_note
from tests.copier.helpers import InProcess, make_stream, profile_for, publish_many, topic_config
from tests.support.faults import compare, metric, read_stream, scrape, wait_count
from tests.support.tcp_proxy import TcpProxy

SCALED = {"workers": 2, "queue_group": "fleet_grp", "name": None}
LIMIT = 2000  # the target stream's max_msg_size; the source takes more


async def _source_with_one_big_message(nc: Client) -> int:
    await make_stream(nc, allow_msg_ttl=True)
    await publish_many(nc, 20)
    big = await nc.jetstream().publish("fleet.big", b"B" * 5000, headers={"Nats-TTL": "1h", "X-Kept": "yes"})
    await publish_many(nc, 20, start=20)
    return int(big.seq)


def _sum(text: str, name: str) -> float:
    """A metric summed over the workers (each worker has its own series)."""
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


async def _wait_sum(port: int, name: str, want: float, within: float) -> float:
    deadline = asyncio.get_running_loop().time() + within
    got = 0.0
    while asyncio.get_running_loop().time() < deadline:
        with contextlib.suppress(OSError):  # the monitor is not up yet
            got = _sum(await asyncio.to_thread(scrape, port), name)
            if got == want:
                break
        await asyncio.sleep(0.2)
    return got


def _readyz(port: int) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", ["ordered", "scaled"])
async def test_poison_is_dead_lettered_or_skipped_and_never_holds_up_the_rest(
    mode: str, source_server: LocalNatsServer, target_server: LocalNatsServer, source_nc: Client,
    target_nc: Client, caplog: pytest.LogCaptureFixture,
) -> None:
    """Over the target stream's max_msg_size (10054, permanent): given up after 5 attempts; ordered
    mode here dead-letters it (headers made inert, the error attached), scaled mode skips it."""
    caplog.set_level(logging.INFO, logger="replicator")
    big = await _source_with_one_big_message(source_nc)
    await make_stream(target_nc, max_msg_size=LIMIT)
    await make_stream(target_nc, "DEAD", ["dead.>"])
    dead_letter = {"dead_letter": "dead.fleet"} if mode == "ordered" else {}
    port = free_port()
    profile = profile_for(topic_config(source_server.url, target_server.url, monitor=port, **dead_letter,
                                       **(SCALED if mode == "scaled" else {})))
    async with InProcess(profile):
        assert await wait_count(target_nc, "FLEET", 40, 60) is not None
        assert await _wait_sum(port, "stream_replicator_poison_msgs_total", 1.0, 30) == 1.0
        exposition = await asyncio.to_thread(scrape, port)
    source = [m for m in await read_stream(source_nc, "FLEET") if m.seq != big]
    outcome = compare(f"poison ({mode})", source, await read_stream(target_nc, "FLEET"), recover_s=None)
    assert outcome.lost == 0 and outcome.mismatched == 0, outcome
    if mode == "ordered":
        assert outcome.duplicated == 0 and outcome.out_of_order == 0
    gave_up = [r.getMessage() for r in caplog.records if "gave up" in r.getMessage()]
    assert len(gave_up) == 1 and f"source sequence {big} " in gave_up[0] and "10054" in gave_up[0], gave_up
    dead = await read_stream(target_nc, "DEAD")
    if mode == "ordered":
        assert "dead-lettered to dead.fleet" in gave_up[0]
        assert metric(exposition, "stream_replicator_dead_letter_msgs_total") == 1.0
        (letter,) = dead
        assert letter.data == b"B" * 5000 and letter.source_seq == big
        assert "10054" in letter.headers["Stream-Replicator-Error"]
        assert letter.headers["Stream-Replicator-Subject"] == "fleet.big"
        assert letter.headers["Stream-Replicator-Orig-Nats-TTL"] == "1h" and letter.headers["X-Kept"] == "yes"
    else:
        assert dead == [] and "skipped" in gave_up[0]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", ["ordered", "scaled"])
async def test_an_unknown_error_is_retried_then_reported_stuck_until_it_clears(
    mode: str, monkeypatch: pytest.MonkeyPatch, source_server: LocalNatsServer, target_server: LocalNatsServer,
    source_nc: Client, target_nc: Client,
) -> None:
    """A newer server's error code (simulated: 10054 taken out of the table) is not poison: the
    message is retried, and after the grace period (1.5 s here, 60 s normally) the worker reports
    itself stuck in the `stuck` gauge, /readyz and `report`; once the target takes the message
    (its limit raised), it copies on and the report clears."""
    monkeypatch.delitem(failures.CODES, 10054)
    monkeypatch.setattr(poison, "UNKNOWN_GRACE", 1.5)
    big = await _source_with_one_big_message(source_nc)
    await make_stream(target_nc, max_msg_size=LIMIT)
    port = free_port()
    profile = profile_for(topic_config(source_server.url, target_server.url, monitor=port,
                                       **(SCALED if mode == "scaled" else {})))
    async with InProcess(profile):
        assert await _wait_sum(port, "stream_replicator_stuck", 1.0, 30) == 1.0
        status, body = await asyncio.to_thread(_readyz, port)
        assert status == 503 and f"source sequence {big} " in json.dumps(body["stuck"]), body
        row = await report_row(profile)
        assert row.error.startswith("stuck: ") and "10054" in row.error, row
        assert _sum(await asyncio.to_thread(scrape, port), "stream_replicator_poison_msgs_total") == 0.0
        js = target_nc.jetstream()
        config: StreamConfig = (await js.stream_info("FLEET")).config
        config.max_msg_size = -1
        await js.update_stream(config)
        assert await wait_count(target_nc, "FLEET", 41, 30) is not None
        assert await _wait_sum(port, "stream_replicator_stuck", 0.0, 15) == 0.0
        assert (await asyncio.to_thread(_readyz, port))[0] == 200
        assert (await report_row(profile)).error == ""


@pytest.mark.timeout(90)
async def test_a_pod_stuck_on_a_message_that_lands_on_another_pod_stops_reporting_stuck(
    monkeypatch: pytest.MonkeyPatch, source_server: LocalNatsServer, target_server: LocalNatsServer,
    source_nc: Client, target_nc: Client,
) -> None:
    """Scaled mode: the message pod A failed for too long is redelivered to pod B (A's source link
    is down) and lands there. A never sees it again, yet clears its stuck report once it reads the
    group's ack floor; before, it stayed stuck (and unready) for ever."""
    monkeypatch.delitem(failures.CODES, 10054)
    monkeypatch.setattr(poison, "UNKNOWN_GRACE", 1.5)
    monkeypatch.setattr(scaled, "ACK_WAIT", 3.0)  # a nak lost with the link is redelivered soon
    await _source_with_one_big_message(source_nc)
    await make_stream(target_nc, max_msg_size=LIMIT)
    link = await TcpProxy(source_server.port).start()
    group = {"workers": 1, "queued": True, "queue_group": "fleet_grp", "name": None}
    port_a, port_b = free_port(), free_port()
    pod_a = profile_for(topic_config(link.url, target_server.url, monitor=port_a, **group), instance="a")
    pod_b = profile_for(topic_config(source_server.url, target_server.url, monitor=port_b, **group), instance="b")
    try:
        async with InProcess(pod_a):
            assert await _wait_sum(port_a, "stream_replicator_stuck", 1.0, 30) == 1.0
            link.cut()
            js = target_nc.jetstream()
            config: StreamConfig = (await js.stream_info("FLEET")).config
            config.max_msg_size = -1
            await js.update_stream(config)
            async with InProcess(pod_b):
                assert await wait_count(target_nc, "FLEET", 41, 30) is not None
                assert await _wait_sum(port_b, "stream_replicator_stuck", 0.0, 5) == 0.0
                link.restore()
                assert await _wait_sum(port_a, "stream_replicator_stuck", 0.0, 15) == 0.0
                assert (await asyncio.to_thread(_readyz, port_a))[0] == 200
    finally:
        await link.stop()


async def test_workers_sharing_a_consumer_keep_their_own_stuck_notes(
    monkeypatch: pytest.MonkeyPatch, source_server: LocalNatsServer, source_nc: Client,
) -> None:
    """Scaled mode's workers share one consumer: one of two stuck workers clearing its note leaves
    the other's in `report` (one shared note was erased by whichever worker cleared first). A
    worker stopping while stuck takes its note along; the note of one killed while stuck is left
    out of `report` once nobody renewed it for `NOTE_STALE` (pods come back with new names)."""
    monkeypatch.setattr(poison, "NOTE_REFRESH", 0.0)
    await make_stream(source_nc)
    js = source_nc.jetstream()
    await js.add_consumer("FLEET", ConsumerConfig(durable_name="fleet_grp", ack_policy=AckPolicy.EXPLICIT))
    profile = profile_for(topic_config(source_server.url, source_server.url, **SCALED))
    watches = [poison.StuckWatch(SimpleNamespace(  # type: ignore[arg-type]
        source_js=js, source_stream="FLEET", worker=f"fleet_grp_{i}",
        metrics=SimpleNamespace(stuck=SimpleNamespace(set=lambda _value: None))), "fleet_grp", grace=0.0)
        for i in (0, 1)]
    for seq, watch in enumerate(watches, start=7):
        await watch.failed(seq, PublishError("a newer server's error", code=10999))
    error = (await report_row(profile)).error
    assert "fleet_grp_0: source sequence 7 " in error and "fleet_grp_1: source sequence 8 " in error, error
    await watches[0].done(7)
    await watches[1].failed(8, PublishError("a newer server's error", code=10999))  # renewed
    error = (await report_row(profile)).error
    assert "fleet_grp_0" not in error and "fleet_grp_1: source sequence 8 " in error, error
    await watches[1].stopped()
    assert (await report_row(profile)).error == ""
    killed = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=poison.NOTE_STALE + 60)
    await set_consumer_note(js, "FLEET", "fleet_grp", f"{poison.STUCK_NOTE}.fleet_grp_9",
                            f"fleet_grp_9: source sequence 9 failing since ... (as of {killed:%Y-%m-%dT%H:%M:%SZ})")
    assert (await report_row(profile)).error == ""
