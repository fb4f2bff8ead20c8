"""The file store: loaded on start, saved atomically every interval and on close."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from replicator.sampling.limiter import Limiter
from replicator.sampling.state import open_store
from replicator.sampling.state.file import FILE_FORMAT, FileStore
from tests.sampling.helpers import FakeClock, body, eventually, make_profile, value, worker_metrics


async def test_state_survives_a_restart(tmp_path: Path, clock: FakeClock) -> None:
    profile = make_profile(tmp_path, limiter_state="file", age=60)
    metrics = worker_metrics()
    store = await open_store(profile, None, metrics, clock=clock)  # type: ignore[arg-type]
    limiter = Limiter(profile.settings, store, metrics, clock=clock)
    for n in range(200):
        assert await limiter.should_copy("acme.cmdb", None, body(f"n{n}"))
    await store.close()

    path = profile.state_file()
    assert path == tmp_path / "cmdb.json"
    doc = json.loads(path.read_text())
    assert doc["format"] == FILE_FORMAT and len(doc["senders"]) == 200
    assert not list(tmp_path.glob("*.tmp"))  # noqa: ASYNC240 - a test's own temp dir

    clock.advance(30)  # the "restart": half an age later
    metrics2 = worker_metrics()
    store2 = await open_store(profile, None, metrics2, clock=clock)  # type: ignore[arg-type]
    try:
        assert len(store2) == 200 and value(metrics2.limiter_seen) == 200
        limiter2 = Limiter(profile.settings, store2, metrics2, clock=clock)
        copied = [await limiter2.should_copy("acme.cmdb", None, body(f"n{n}")) for n in range(200)]
        assert not any(copied)  # nothing is forwarded a second time within age
        clock.advance(30)
        copied = [await limiter2.should_copy("acme.cmdb", None, body(f"n{n}")) for n in range(200)]
        assert all(copied)
    finally:
        await store2.close()


async def test_saved_periodically_not_only_on_close(tmp_path: Path, clock: FakeClock) -> None:
    profile = make_profile(tmp_path, limiter_state="file")
    metrics = worker_metrics()
    store = FileStore(profile.state_file(), profile.settings, metrics, clock=clock, save_interval=0.1)
    await store.start()
    try:
        limiter = Limiter(profile.settings, store, metrics, clock=clock)
        await limiter.should_copy("acme.cmdb", None, body("n1"))

        def saved() -> bool:
            path = profile.state_file()
            return path.exists() and "n1" in json.loads(path.read_text())["senders"]

        await eventually(saved, within=3)
    finally:
        await store.close()


async def test_an_unreadable_file_starts_empty_and_is_counted(tmp_path: Path, clock: FakeClock) -> None:
    profile = make_profile(tmp_path, limiter_state="file")
    profile.state_file().write_text("{not json")
    metrics = worker_metrics()
    store = await open_store(profile, None, metrics, clock=clock)  # type: ignore[arg-type]
    try:
        assert len(store) == 0
        assert value(metrics.limiter_state_errors) == 1
        limiter = Limiter(profile.settings, store, metrics, clock=clock)
        assert await limiter.should_copy("acme.cmdb", None, body("n1"))
    finally:
        await store.close()
    # and it is replaced by a good one
    assert json.loads(profile.state_file().read_text())["senders"].keys() == {"n1"}


async def test_expired_senders_are_not_loaded(tmp_path: Path, clock: FakeClock) -> None:
    profile = make_profile(tmp_path, limiter_state="file", age=10)
    metrics = worker_metrics()
    store = await open_store(profile, None, metrics, clock=clock)  # type: ignore[arg-type]
    limiter = Limiter(profile.settings, store, metrics, clock=clock)
    await limiter.should_copy("acme.cmdb", None, body("old"))
    clock.advance(9)
    await limiter.should_copy("acme.cmdb", None, body("recent"))
    await store.close()
    clock.advance(5)
    store2 = await open_store(profile, None, worker_metrics(), clock=clock)  # type: ignore[arg-type]
    try:
        assert store2.keys() == ["recent"]
    finally:
        await store2.close()
    await asyncio.sleep(0)


async def test_the_go_replicators_state_file_is_imported(tmp_path: Path, clock: FakeClock) -> None:
    """Taking over a Go-format stream's `state_store` file: its senders are not forwarded again, an
    advised one gets its `recover`, and the file is rewritten in our format."""
    import datetime as dt

    def go_time(seconds_ago: float) -> str:
        stamp = dt.datetime.fromtimestamp(clock() - seconds_ago, dt.UTC)
        return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond:06d}123Z"  # Go's nanoseconds

    profile = make_profile(tmp_path, limiter_state="file", age=60)
    profile.state_file().write_text(json.dumps({"Items": {
        "n1": {"seen": go_time(10), "copied": go_time(10), "size": 31.0},
        "n2": {"seen": go_time(40), "copied": go_time(40), "advised": True, "size": 31.0},
        "old": {"seen": go_time(600), "copied": "0001-01-01T00:00:00Z", "size": 5.0},
    }, "Mutex": {}}))
    metrics = worker_metrics()
    store = await open_store(profile, None, metrics, clock=clock)  # type: ignore[arg-type]
    try:
        assert sorted(store.keys()) == ["n1", "n2"]  # the expired one is dropped
        n2 = store.get("n2")
        assert n2 is not None and n2.announced and n2.adv == n2.seen
        limiter = Limiter(profile.settings, store, metrics, clock=clock)
        assert not await limiter.should_copy("acme.cmdb", None, body("n1"))
    finally:
        await store.close()
    assert json.loads(profile.state_file().read_text())["format"] == FILE_FORMAT
