"""The loop guard against real servers: a city joined to its region as a leafnode (one account,
JetStream domains) is refused at start, or copies with a subject prefix and never grows from our
copies; two sites replicating into each other (active-active) hold every message exactly once; a
copy delivered back without `active_active` stops the replicator with exit status 2."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Iterator
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from replicator.cli.report import build_report, format_report
from replicator.config import parse_config
from replicator.copier.loops import LoopGuard, overlap, subjects_meet
from replicator.copier.provenance import Provenance
from replicator.demo.local_nats import LocalNatsServer
from tests.copier.helpers import (
    InProcess,
    make_stream,
    profile_for,
    publish_many,
    spawn,
    topic_config,
    write_config,
)
from tests.support.faults import read_stream, stream_count, wait_count


def test_subject_patterns_meet() -> None:
    assert subjects_meet("fleet.>", "fleet.a.b") and subjects_meet("fleet.*.x", "fleet.a.*")
    assert subjects_meet(">", "a") and subjects_meet("a.*", "a.b")
    assert not subjects_meet("region.fleet.>", "fleet.>") and not subjects_meet("fleet.>", "fleet")
    assert not subjects_meet("a.*", "a.b.c") and not subjects_meet("a.b", "a.c")
    assert overlap("fleet.>", ["fleet.a", "other.>", "*.b"]) == ["fleet.a", "*.b"]


@pytest.fixture
async def leaf_ncs(region_and_city: tuple[LocalNatsServer, LocalNatsServer]) -> AsyncIterator[tuple[Client, Client]]:
    region, city = region_and_city
    region_nc, city_nc = await nats.connect(region.url), await nats.connect(city.url)
    yield region_nc, city_nc
    await city_nc.close()
    await region_nc.close()


@pytest.mark.timeout(60)
async def test_a_city_that_is_a_leafnode_of_its_region_is_refused_with_the_overlap_named(
    region_and_city: tuple[LocalNatsServer, LocalNatsServer], leaf_ncs: tuple[Client, Client], tmp_path: Any,
) -> None:
    """Without the guard every copy published on the region would reach the city's stream through
    the leafnode and be copied again. The replicator refuses at start (exit 2, the overlap and the
    fixes named), creates no region stream and the city's stream never grows."""
    region, city = region_and_city
    region_nc, city_nc = leaf_ncs
    await make_stream(city_nc)
    await publish_many(city_nc, 50)
    config = write_config(tmp_path / "sr.yaml", topic_config(city.url, region.url))
    proc = spawn(config, log_path=tmp_path / "sr.log")
    assert proc.wait(timeout=30) == 2
    text = (tmp_path / "sr.log").read_text()
    assert "copy loop" in text and "'fleet.>'" in text and "source stream FLEET captures" in text, text
    assert "target_subject_prefix" in text and "another account" in text and "native" in text, text
    assert "test.yaml" not in text and "topics.fleet.topic" in text
    await asyncio.sleep(1.0)
    assert await stream_count(city_nc, "FLEET") == 50
    with pytest.raises(nats.js.errors.NotFoundError):
        await region_nc.jetstream().stream_info("FLEET")


@pytest.mark.timeout(60)
async def test_with_a_subject_prefix_the_city_never_grows_from_our_copies(
    region_and_city: tuple[LocalNatsServer, LocalNatsServer], leaf_ncs: tuple[Client, Client],
) -> None:
    """The fix the refusal names: copies land on `region.fleet.>`, which the city does not capture."""
    region, city = region_and_city
    region_nc, city_nc = leaf_ncs
    await make_stream(city_nc)
    await publish_many(city_nc, 200)
    profile = profile_for(topic_config(city.url, region.url, target_subject_prefix="region"))
    async with InProcess(profile):
        assert await wait_count(region_nc, "FLEET", 200, 30) is not None
        await publish_many(city_nc, 200, start=200)
        assert await wait_count(region_nc, "FLEET", 400, 30) is not None
        await asyncio.sleep(1.5)
    assert await stream_count(city_nc, "FLEET") == 400
    assert await stream_count(region_nc, "FLEET") == 400
    subjects = {m.subject for m in await read_stream(region_nc, "FLEET")}
    assert all(s.startswith("region.fleet.") for s in subjects)


@pytest.fixture
def site_b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalNatsServer]:
    server = LocalNatsServer(name="site-b", store_dir=tmp_path_factory.mktemp("site-b")).start()
    yield server
    server.close()


def _loop_skipped(replicator: Any) -> float:
    registry = replicator.metrics.registry
    return sum(s.value for metric in registry.collect() if metric.name == "stream_replicator_loop_skipped_msgs"
               for s in metric.samples if s.name.endswith("_total"))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["ordered", "scaled"])
async def test_active_active_holds_every_message_exactly_once_on_each_side(
    mode: str, source_server: LocalNatsServer, site_b: LocalNatsServer, source_nc: Client,
) -> None:
    """Sites A and B, each a FLEET stream on `fleet.>`, each replicated into the other with
    `active_active`: a copy is never copied back to where it came from, so each side ends with its
    own messages and the other's, each exactly once, and each replicator counts the copies it skipped."""
    b_nc = await nats.connect(site_b.url)
    try:
        for nc in (source_nc, b_nc):
            await make_stream(nc)
        extra: dict[str, Any] = {"workers": 2, "queue_group": "grp"} if mode == "scaled" else {}
        ab = profile_for(topic_config(source_server.url, site_b.url, name="ab", active_active=True, **extra))
        ba = profile_for(topic_config(site_b.url, source_server.url, name="ba", active_active=True, **extra))
        async with InProcess(ab) as rab, InProcess(ba) as rba:
            await asyncio.gather(publish_many(source_nc, 300, subject="fleet.a.n{i}"),
                                 publish_many(b_nc, 300, subject="fleet.b.n{i}"))
            for nc in (source_nc, b_nc):
                assert await wait_count(nc, "FLEET", 600, 60) is not None
            await asyncio.sleep(2.0)
        for nc in (source_nc, b_nc):
            msgs = await read_stream(nc, "FLEET")
            seen = collections.Counter((m.subject, m.data) for m in msgs)
            assert len(msgs) == 600 and len(seen) == 600 and set(seen.values()) == {1}
        assert _loop_skipped(rab) == 300 and _loop_skipped(rba) == 300
    finally:
        await b_nc.close()


@pytest.mark.timeout(90)
async def test_a_copy_delivered_back_without_active_active_is_refused(
    source_server: LocalNatsServer, site_b: LocalNatsServer, source_nc: Client, tmp_path: Any,
) -> None:
    """A copies into B; B's replicator back into A, not told it is active-active, meets A's copy
    at its first delivery: it stops with exit status 2 naming the loop, copies nothing, and its
    consumer's note shows in `report`."""
    b_nc = await nats.connect(site_b.url)
    try:
        for nc in (source_nc, b_nc):
            await make_stream(nc)
        await publish_many(source_nc, 20)
        async with InProcess(profile_for(topic_config(source_server.url, site_b.url, name="ab"))):
            assert await wait_count(b_nc, "FLEET", 20, 30) is not None
        back = topic_config(site_b.url, source_server.url, name="ba")
        proc = spawn(write_config(tmp_path / "ba.yaml", back), log_path=tmp_path / "ba.log")
        assert proc.wait(timeout=30) == 2
        text = (tmp_path / "ba.log").read_text()
        assert "copy loop: source sequence 1 of FLEET is a copy from target stream FLEET" in text, text
        assert "active_active: true" in text
        assert await stream_count(source_nc, "FLEET") == 20
        rows = await build_report(parse_config(back, "ba.yaml"), "ba.yaml")
        assert rows[0].loops.startswith("refused: source sequence 1 is a copy from target stream FLEET"), rows
        assert "| Loops" in format_report(rows)
    finally:
        await b_nc.close()


class _Writer:
    id = "W1"


class _Transform:
    writer = _Writer()


def test_own_copies_and_copies_from_the_target_are_loops_others_are_not() -> None:
    """`why` on provenance alone: this writer's copy, or one whose place of origin is the target
    stream instance, loops; a same-named stream elsewhere (fan-in from many cities) does not."""
    ep: Any = type("Ep", (), {"profile": profile_for(topic_config("nats://127.0.0.1:1", "nats://127.0.0.1:2",
                                                                  active_active=True)),
                              "target_stream": "FLEET", "metrics": None})()
    guard = LoopGuard(ep, _Transform(), "sr")  # type: ignore[arg-type]
    guard.target_instance = "TGT00001"
    assert guard.why(Provenance("FLEET", 5, "sr", 1, "W1", "SRC00001")) is not None
    assert guard.why(Provenance("FLEET", 5, "other", 1, "W2", "TGT00001")) is not None
    assert guard.why(Provenance("FLEET", 5, "other", 1, "W2", "CITY0002")) is None  # another city's FLEET
    assert guard.why(Provenance("FLEET", 5, "other", 1, "W2")) is None  # an earlier release: no instance
    assert guard.why(None) is None
