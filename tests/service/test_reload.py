"""What a reload restarts (the plan, pure) and what a file that does not load leaves running."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml
from nats.aio.client import Client

from replicator.config import Profile, parse_config
from replicator.config.files import load_config
from replicator.config.model import Config
from replicator.demo.local_nats import LocalNatsServer, free_port
from replicator.service.process import ReplicatorProcess
from replicator.service.reload import ConfigWatch, plan
from tests.copier.helpers import indices, make_stream, publish_many, read_all
from tests.support.faults import metric, scrape, wait_count, wait_metric


def topic(name: str, **extra: Any) -> dict[str, Any]:
    return {"topic": f"{name}.>", "source_url": "nats://127.0.0.1:4222", "target_url": "nats://127.0.0.1:4223",
            **extra}


def profiles(config: dict[str, Any]) -> dict[str, Profile]:
    parsed = parse_config(config, "pool.yaml")
    return {name: Profile(parsed, name, source="pool.yaml") for name in parsed.topics}


async def start_reloading(path: Path) -> tuple[ReplicatorProcess, asyncio.Future[None]]:
    """The process `replicate --reload` runs for the file at `path`, running."""

    def load() -> tuple[Config, list[Profile]]:
        config = load_config(path)
        return config, [Profile(config, name, source=str(path)) for name in config.topics]

    config, first = load()
    process = ReplicatorProcess(config, first, loader=load, watch=str(path))
    return process, asyncio.ensure_future(process.run())


@contextlib.asynccontextmanager
async def reloading(path: Path) -> AsyncIterator[tuple[ReplicatorProcess, asyncio.Future[None]]]:
    process, task = await start_reloading(path)
    try:
        yield process, task
    finally:
        process.stop()
        await asyncio.wait_for(task, 30)


def test_only_the_profiles_that_changed_restart() -> None:
    running = profiles({"topics": {"a": topic("a"), "b": topic("b"), "c": topic("c")}})
    wanted = profiles({"topics": {"a": topic("a"), "b": topic("b", max_in_flight=10), "d": topic("d")}})
    changes = plan(running, list(wanted.values()))
    assert [p.profile for p in changes.start] == ["b", "d"]
    assert changes.stop == ["b", "c"] and changes.kept == ["a"]
    assert changes.describe(running) == "added d; changed b; removed c; 1 unchanged"


def test_the_monitor_port_is_the_process_s_not_a_copy_s() -> None:
    running = profiles({"topics": {"a": topic("a", monitor=8080)}})
    assert plan(running, list(profiles({"topics": {"a": topic("a", monitor=9090)}}).values())).empty


def test_globals_a_profile_reads_restart_it_and_logging_does_not() -> None:
    base = {"topics": {"a": topic("a")}}
    running = profiles(base)
    assert plan(running, list(profiles({**base, "name": "region-eu"}).values())).stop == ["a"]  # provenance
    assert plan(running, list(profiles({**base, "state_dir": "/var/lib/sr"}).values())).stop == ["a"]
    assert plan(running, list(profiles({**base, "log_level": "debug"}).values())).empty


def test_the_watch_sees_a_new_file_once(tmp_path: Path) -> None:
    path = tmp_path / "sr.yaml"
    path.write_text("a")
    watch = ConfigWatch(path)
    assert not watch.changed()
    path.write_text("b")
    assert watch.changed() and not watch.changed()
    path.unlink()
    assert watch.changed()  # gone is a change; a reload then fails to read it and keeps what runs
    path.write_text("b")
    assert watch.changed()


async def test_a_file_that_does_not_load_leaves_every_copy_running(
        tmp_path: Path, source_server: LocalNatsServer, target_server: LocalNatsServer, source_nc: Client,
        target_nc: Client) -> None:
    await make_stream(source_nc, "A", ["a.>"])
    port = free_port()
    path = tmp_path / "sr.yaml"
    good = {"topics": {"a": {**topic("a", monitor=port), "source_url": source_server.url,
                             "target_url": target_server.url, "name": "sr_a"}}}
    path.write_text(yaml.safe_dump(good))

    async with reloading(path) as (process, _task):
        await publish_many(source_nc, 100, subject="a.n{i}")
        assert await wait_count(target_nc, "A", 100, 30) is not None
        replicator = process.replicators[0]
        path.write_text("topics: {a: {topic: a.>, source_url: nowhere}}\n")
        assert await wait_metric(port, "stream_replicator_config_last_reload_successful", 0.0, 20)
        text = await asyncio.to_thread(scrape, port)
        assert metric(text, "stream_replicator_config_reloads_total", result="error") == 1.0
        assert process.replicators == [replicator]
        await publish_many(source_nc, 100, start=100, subject="a.n{i}")
        assert await wait_count(target_nc, "A", 200, 30) is not None  # still copying
        path.write_text(yaml.safe_dump({**good, "log_level": "info"}))  # loads, changes no copy
        process.reload_soon()
        assert await wait_metric(port, "stream_replicator_config_last_reload_successful", 1.0, 20)
        assert process.replicators == [replicator]


async def test_a_stop_during_a_reload_still_lets_the_removed_profile_finish_cleanly(
        tmp_path: Path, source_server: LocalNatsServer, target_server: LocalNatsServer, source_nc: Client,
        target_nc: Client) -> None:
    for name in ("A", "B"):
        await make_stream(source_nc, name, [f"{name.lower()}.>"])
    path = tmp_path / "sr.yaml"

    def pool(names: list[str]) -> dict[str, Any]:
        return {"topics": {n: {**topic(n), "source_url": source_server.url, "target_url": target_server.url,
                               "name": f"sr_{n}"} for n in names}}

    path.write_text(yaml.safe_dump(pool(["a", "b"])))

    publishing = asyncio.ensure_future(publish_many(source_nc, 20_000, subject="b.n{i}"))
    try:
        process, task = await start_reloading(path)
        assert await wait_count(target_nc, "B", 1000, 30) is not None
        path.write_text(yaml.safe_dump(pool(["a"])))
        process.reload_soon()  # the process's own watch reloads, and waits for b's clean stop ...
        for _ in range(10_000):  # turns of the loop, until the reload took b out and waits for it
            if "b" not in process.running:
                break
            await asyncio.sleep(0)
        process.stop()  # ... when the process is told to stop
        await asyncio.wait_for(task, 30)
    finally:
        await publishing
    upto = (await source_nc.jetstream().consumer_info("B", "sr_b")).ack_floor.stream_seq
    copied = await read_all(target_nc, "B")
    assert indices(copied) == list(range(upto)) and upto > 0  # what it acked, once each and in order


async def test_in_a_pool_a_profile_failing_for_good_stops_alone(
        tmp_path: Path, source_server: LocalNatsServer, target_server: LocalNatsServer, source_nc: Client,
        target_nc: Client) -> None:
    """A replication added with unusable credentials (a damaged .creds file) fails alone: the
    others go on copying, `/readyz` names it, and a reload without it makes the pool ready again."""
    await make_stream(source_nc, "A", ["a.>"])
    creds = tmp_path / "damaged.creds"
    creds.write_text("not a creds file\n")
    port = free_port()
    path = tmp_path / "sr.yaml"

    def pool(bad: bool) -> dict[str, Any]:
        topics = {"a": {**topic("a", monitor=port), "source_url": source_server.url,
                        "target_url": target_server.url, "name": "sr_a"}}
        if bad:
            topics["bad"] = {**topic("bad", monitor=port), "source_url": source_server.url,
                             "target_url": target_server.url, "source_credentials": str(creds)}
        return {"topics": topics}

    path.write_text(yaml.safe_dump(pool(False)))

    async with reloading(path) as (process, task):
        await publish_many(source_nc, 100, subject="a.n{i}")
        assert await wait_count(target_nc, "A", 100, 30) is not None
        path.write_text(yaml.safe_dump(pool(True)))
        assert await process.reload()
        for _ in range(100):
            if "bad" in process.failed:
                break
            await asyncio.sleep(0.1)
        ready, detail = process.readiness()
        assert not ready and "bad" in detail["failed"]  # type: ignore[operator]
        assert not task.done()  # the pool goes on ...
        await publish_many(source_nc, 100, start=100, subject="a.n{i}")
        assert await wait_count(target_nc, "A", 200, 30) is not None  # ... and so does the copy
        path.write_text(yaml.safe_dump(pool(False)))
        assert await process.reload()
        assert not process.failed and process.readiness()[0]
    assert task.result() is None  # a clean stop: the failure was told, not raised again
