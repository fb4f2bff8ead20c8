"""The `state` and `advisories` subcommands against real stores and a real advisory stream."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from nats.aio.client import Client

from replicator.cli import advisories as advisories_cli
from replicator.cli import state as state_cli
from replicator.config import load_profile
from replicator.demo.local_nats import LocalNatsServer
from replicator.sampling.advisories import Advisor
from replicator.sampling.limiter import Limiter
from replicator.sampling.state import open_store
from replicator.sampling.state.memory import MemoryStore
from replicator.sampling.state.records import Sender
from tests.sampling.helpers import FakeClock, body, eventually, worker_metrics


def write_config(tmp_path: Path, source: str, target: str, **topic: Any) -> Path:
    settings = {"topic": "acme.cmdb", "source_url": source, "target_url": target, "inspect": "sender",
                "age": "1h", "advisory": {"target": "sr.adv.cmdb", "cluster": "target", "age": "30m"}}
    settings.update(topic)
    path = tmp_path / "sr.yaml"
    path.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"), "topics": {"cmdb": settings}}))
    return path


def parse(module: Any, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args(list(argv))


async def fill(profile_path: Path, js: Any, senders: dict[str, float]) -> None:
    """Track senders last seen at the given unix times through the real store."""
    profile = load_profile(profile_path, "cmdb")
    clock = FakeClock()
    store = await open_store(profile, js, worker_metrics(), clock=clock)
    limiter = Limiter(profile.settings, store, worker_metrics(), clock=clock)
    for sender, seen in sorted(senders.items(), key=lambda kv: kv[1]):
        clock.now = seen
        await limiter.should_copy("acme.cmdb", None, body(sender))
    await store.close()


async def test_state_of_a_file_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    now = time.time()
    path = write_config(tmp_path, "nats://127.0.0.1:1", "nats://127.0.0.1:2", limiter_state="file")
    await fill(path, None, {"web-1": now - 5, "web-2": now - 1900, "db-1": now - 7200})

    assert await state_cli.run(parse(state_cli, "--config", str(path), "--topic", "cmdb")) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["VALUE", "STATUS", "LAST"]
    statuses = [line.split()[:2] for line in lines[1:4]]
    assert statuses == [["db-1", "expired"], ["web-1", "ok"], ["web-2", "silent"]]
    assert lines[-1] == "3 of 3 tracked senders"

    args = parse(state_cli, "--config", str(path), "--topic", "cmdb", "--value", "^web",
                 "--older-than", "10m", "--json")
    assert await state_cli.run(args) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["value"] == "web-2" and row["status"] == "silent" and 1890 <= row["seen_ago"] <= 1910


async def test_state_of_a_kv_store(tmp_path: Path, source_server: LocalNatsServer, source_nc: Client,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(tmp_path, source_server.url, "nats://127.0.0.1:2", limiter_state="kv")
    await fill(path, source_nc.jetstream(), {f"node-{n}": time.time() for n in range(25)})
    assert await state_cli.run(parse(state_cli, "--config", str(path), "--topic", "cmdb", "--json")) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["value"] for r in rows] == sorted(f"node-{n}" for n in range(25))
    assert {r["status"] for r in rows} == {"ok"}


async def test_state_errors_are_explained(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(tmp_path, "nats://127.0.0.1:1", "nats://127.0.0.1:2")  # memory store
    assert await state_cli.run(parse(state_cli, "--config", str(path), "--topic", "cmdb")) == 1
    assert "lives inside the running replicator" in capsys.readouterr().err
    assert await state_cli.run(parse(state_cli, "--config", str(path), "--topic", "nope")) == 2
    assert "no topic 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(state_cli, "--config", str(path), "--topic", "cmdb", "--older-than", "soon")


async def _publish_advisories(path: Path, nc: Client, values: list[str]) -> None:
    profile = load_profile(path, "cmdb")
    store = MemoryStore(profile.settings, worker_metrics())
    advisor = Advisor(profile, store, nc, worker_metrics(), replicator_name="dc1")
    for value in values:
        await store.observe(value, time.time(), 10, lambda s: True)
    await advisor.start()
    advisor.set_active(True)
    await advisor.scan()
    await advisor.drain()
    await advisor.stop()
    assert isinstance(store.get(values[0]), Sender)


async def test_advisories_from_the_stream(tmp_path: Path, target_server: LocalNatsServer, target_nc: Client,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(tmp_path, "nats://127.0.0.1:1", target_server.url)
    await target_nc.jetstream().add_stream(name="ADV", subjects=["sr.adv.>"])
    await _publish_advisories(path, target_nc, ["web-1", "web-2", "db-1"])

    assert await advisories_cli.run(parse(advisories_cli, "--config", str(path), "--topic", "cmdb")) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all(" new " in line for line in lines)
    assert {line.split()[2] for line in lines} == {"web-1", "web-2", "db-1"}

    args = parse(advisories_cli, "--config", str(path), "--topic", "cmdb", "--value", "^web", "--json",
                 "--since", "10m")
    assert await advisories_cli.run(args) == 0
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(d["value"] for d in docs) == ["web-1", "web-2"]

    await asyncio.sleep(1.1)
    args = parse(advisories_cli, "--config", str(path), "--topic", "cmdb", "--since", "1s")
    assert await advisories_cli.run(args) == 0
    assert capsys.readouterr().out == ""


async def test_advisories_follow(tmp_path: Path, target_server: LocalNatsServer, target_nc: Client,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(tmp_path, "nats://127.0.0.1:1", target_server.url)
    # without a stream: only --follow makes sense
    assert await advisories_cli.run(parse(advisories_cli, "--config", str(path), "--topic", "cmdb")) == 1
    assert "use --follow" in capsys.readouterr().err

    for with_stream in (False, True):
        if with_stream:
            await target_nc.jetstream().add_stream(name="ADV", subjects=["sr.adv.>"])
        args = parse(advisories_cli, "--config", str(path), "--topic", "cmdb", "--follow", "--json")
        task = asyncio.ensure_future(advisories_cli.run(args))
        await asyncio.sleep(0.3)  # subscribed
        await _publish_advisories(path, target_nc, [f"live-{with_stream}"])
        seen: list[str] = []

        def got(seen: list[str] = seen, wanted: str = f"live-{with_stream}") -> bool:
            seen.extend(capsys.readouterr().out.splitlines())
            return any(wanted in line for line in seen)

        await eventually(got, within=5)
        assert not task.done()  # still following
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
