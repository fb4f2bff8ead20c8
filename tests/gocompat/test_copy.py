"""Go-format stream keys, each shown by its effect on real servers. Several `streams[]` entries share
one source stream and run in one process (as the Go tool runs a file), each into its own target
stream, so one publish exercises many keys."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from nats.js.api import StreamConfig
from nats.js.errors import NotFoundError

from replicator.copier.provenance import CHORIA_SOURCE, PROVENANCE
from replicator.service.process import ReplicatorProcess
from tests.gocompat.conftest import Rig

pytestmark = pytest.mark.timeout(90)


async def test_start_options_and_max_age(rig: Rig) -> None:
    """start_sequence / start_time / start_delta / start_at_end pick the first message; max_age skips
    old ones. Five streams of one file, one process."""
    src = rig.name("START")
    root = src.lower()
    await rig.sjs.add_stream(StreamConfig(name=src, subjects=[f"{root}.>"]))
    for i in range(1, 6):
        await rig.sjs.publish(f"{root}.old", f"old {i}".encode())
    await asyncio.sleep(2.5)
    middle = dt.datetime.now(dt.UTC)
    await asyncio.sleep(2.5)
    for i in range(6, 11):
        await rig.sjs.publish(f"{root}.new", f"new {i}".encode())
    cases: dict[str, dict[str, Any]] = {
        "SEQ": {"start_sequence": 4},
        "TIME": {"start_time": middle.isoformat()},
        "DELTA": {"start_delta": "2500ms"},  # a Go duration: now - 2.5 s falls between the two batches
        "END": {"start_at_end": True},
        "AGE": {"max_age": "2500ms"},
    }
    streams = [rig.stream(src, name=name, target_stream=f"{src}_{name}", target_subject_prefix=name.lower(),
                          **settings) for name, settings in cases.items()]
    async with rig.replicating(rig.config(*streams)) as process:
        assert await rig.wait_count(f"{src}_AGE", 5) == 5
        for _ in range(200):  # every consumer made (start_at_end starts from its creation)
            if process.readiness()[0]:
                break
            await asyncio.sleep(0.05)
        for i in range(11, 13):
            await rig.sjs.publish(f"{root}.later", f"later {i}".encode())
        assert await rig.wait_count(f"{src}_END", 2) == 2
        assert await rig.wait_count(f"{src}_SEQ", 9) == 9
    copied = {name: [int(m.data.split()[1]) for m in await rig.read(f"{src}_{name}")] for name in cases}
    assert copied == {
        "SEQ": list(range(4, 13)),
        "TIME": list(range(6, 13)),
        "DELTA": list(range(6, 13)),
        "END": [11, 12],
        "AGE": list(range(6, 13)),
    }


def _sample(sender: str, kind: str, i: int, *, force: bool | None = None, pad: int = 0) -> tuple[str, bytes, dict]:
    body: dict[str, Any] = {"sender": sender, "i": i, "pad": "x" * pad}
    if force is not None:
        body["force"] = force
    return f"{kind}.{sender}", json.dumps(body).encode(), {"Sender": sender}


async def _received(process: ReplicatorProcess, count: int) -> None:
    """Wait until every replicator of the process received `count` messages (copied or not)."""
    for replicator in process.replicators:
        labels = {"name": replicator.profile.base_name, "worker": f"{replicator.profile.base_name}_0"}
        for _ in range(200):
            got = replicator.metrics.registry.get_sample_value("stream_replicator_received_msgs_total", labels)
            if got == count:
                break
            await asyncio.sleep(0.1)
        assert got == count, (labels, got)


async def test_sampling_by_field_header_token_and_subject_with_force_and_size_triggers(rig: Rig) -> None:
    """Every inspection mode the Go docs promise (header and token never activate in the Go tool),
    `inspect_force_field` copying when the field is true (not merely present) and `size_trigger`."""
    src = rig.name("SAMPLE")
    root = src.lower()
    await rig.sjs.add_stream(StreamConfig(name=src, subjects=[f"{root}.>"]))
    messages = []
    for i in range(4):
        for sender in ("n1", "n2", "n3"):
            kind = "a" if i % 2 == 0 else "b"
            force = True if (sender, i) == ("n1", 2) else False if (sender, i) == ("n2", 1) else None
            pad = 300 if (sender, i) == ("n3", 3) else 0
            messages.append(_sample(sender, kind, i, force=force, pad=pad))
    for subject, body, headers in messages:
        await rig.sjs.publish(f"{root}.{subject}", body, headers=headers)
    base = {"inspect_duration": "1h"}
    cases: dict[str, tuple[dict[str, Any], int]] = {
        "FIELD": ({"inspect_field": "sender"}, 3),
        "HEADER": ({"inspect_header": "Sender"}, 3),
        "TOKEN": ({"inspect_subject_token": 3}, 3),  # <root>.<kind>.<sender>
        "SUBJECT": ({"inspect_subject_token": -1}, 6),  # the whole subject: (kind, sender) pairs
        "FORCE": ({"inspect_field": "sender", "inspect_force_field": "force"}, 4),
        "SIZE": ({"inspect_field": "sender", "size_trigger": 200}, 4),
    }
    streams = [rig.stream(src, name=name, target_stream=f"{src}_{name}", target_subject_prefix=name.lower(),
                          **base, **settings) for name, (settings, _) in cases.items()]
    async with rig.replicating(rig.config(*streams)) as process:
        await _received(process, 12)  # every message looked at: nothing more will be copied
    got = {name: [(m.subject.split(".", 1)[1], json.loads(m.data)["i"]) for m in await rig.read(f"{src}_{name}")]
           for name in cases}
    assert {name: len(v) for name, v in got.items()} == {name: n for name, (_, n) in cases.items()}
    assert [i for _, i in got["FIELD"]] == [0, 0, 0]
    assert (f"{root}.a.n1", 2) in got["FORCE"] and (f"{root}.b.n2", 1) not in got["FORCE"]
    assert (f"{root}.b.n3", 3) in got["SIZE"]


@pytest.mark.parametrize("mode", ["created", "no_target_create", "target_initiated"])
async def test_subject_rewrite_filter_and_target_creation(rig: Rig, mode: str) -> None:
    """prefix/remove rewrite subjects (and the created target's); filter_subject narrows the copy;
    no_target_create leaves the target alone and copies into whichever stream captures them;
    target_initiated copies the same way and keeps the headers (the Go tool's push mode drops them)."""
    no_target_create = mode == "no_target_create"
    src = rig.name("SHAPE")
    root = src.lower()
    await rig.sjs.add_stream(StreamConfig(name=src, subjects=[f"{root}.>"]))
    for kind in ("eu", "us", "eu"):
        await rig.sjs.publish(f"{root}.{kind}.host", kind.encode(), headers={"X-Origin": kind})
    landing = f"{src}_LANDING"
    if no_target_create:
        await rig.tjs.add_stream(StreamConfig(name=landing, subjects=[f"to_{src}.>"], max_msgs=1000))
    stream = rig.stream(src, filter_subject=f"{root}.eu.>", target_subject_prefix=f"to_{src}",
                        target_subject_remove=f"{root}.", no_target_create=no_target_create,
                        target_initiated=mode == "target_initiated")
    async with rig.replicating(rig.config(stream)):
        where = landing if no_target_create else src
        assert await rig.wait_count(where, 2) == 2
    msgs = await rig.read(landing if no_target_create else src)
    assert [m.subject for m in msgs] == [f"to_{src}.eu.host"] * 2
    assert [m.data for m in msgs] == [b"eu", b"eu"]
    assert [m.headers.get("X-Origin") for m in msgs] == ["eu", "eu"]
    if no_target_create:
        with pytest.raises(NotFoundError):
            await rig.tjs.stream_info(src)
        assert (await rig.tjs.stream_info(landing)).config.max_msgs == 1000  # untouched
    else:
        assert (await rig.tjs.stream_info(src)).config.subjects == [f"to_{src}.>"]
    source, copied = (await rig.read(src, rig.source))[0], msgs[0]
    assert copied.headers[CHORIA_SOURCE].split()[:4] == [src, str(source.seq), "SITE", "SITE"]
    assert copied.headers[PROVENANCE].startswith(f"{src} {source.seq} SR_SITE_{src} ")


@pytest.mark.parametrize("state_store", [True, False], ids=["state_store", "memory"])
async def test_state_store_keeps_the_sampled_senders_across_a_restart(rig: Rig, tmp_path: Path,
                                                                      state_store: bool) -> None:
    """With `state_store`, a sender copied before a restart is not copied again within
    `inspect_duration` (its senders are in `<stream>_<name>.json` there); without, the limiter
    starts empty after a restart, as in the Go tool."""
    src = rig.name("STATE")
    await rig.sjs.add_stream(StreamConfig(name=src, subjects=[f"{src.lower()}.>"]))
    store = tmp_path / "state"
    config = rig.config(rig.stream(src, inspect_field="sender", inspect_duration="1h"),
                        **({"state_store": str(store)} if state_store else {}))
    for run in range(2):
        await rig.sjs.publish(f"{src.lower()}.x", json.dumps({"sender": "n1", "run": run}).encode())
        async with rig.replicating(config) as process:
            await _received(process, 1)
    assert [json.loads(m.data)["run"] for m in await rig.read(src)] == ([0] if state_store else [0, 1])
    assert (store / f"{src}_SITE.json").exists() is state_store


@pytest.mark.parametrize("ephemeral", [True, False])
async def test_ephemeral_copies_everything_again_on_every_start(rig: Rig, ephemeral: bool) -> None:
    """`ephemeral` (meant for KV buckets): a recreated target is refilled at the next start; a
    durable resumes after what it copied, as in the Go tool."""
    src = rig.name("EPH")
    root = src.lower()
    await rig.sjs.add_stream(StreamConfig(name=src, subjects=[f"{root}.>"]))
    for i in range(5):
        await rig.sjs.publish(f"{root}.k{i}", b"v")
    config = rig.config(rig.stream(src, ephemeral=ephemeral))
    async with rig.replicating(config):
        assert await rig.wait_count(src, 5) == 5
    consumer = await rig.sjs.consumer_info(src, "SR_SITE")
    assert bool(consumer.config.mem_storage) is ephemeral
    await rig.tjs.delete_stream(src)
    async with rig.replicating(config):
        await rig.sjs.publish(f"{root}.k5", b"v")
        assert await rig.wait_count(src, 6 if ephemeral else 1) == (6 if ephemeral else 1)
    assert [m.subject for m in await rig.read(src)] == (
        [f"{root}.k{i}" for i in range(6)] if ephemeral else [f"{root}.k5"])


async def test_replicate_command_runs_a_two_stream_file_as_its_systemd_unit_does(rig: Rig, tmp_path: Path) -> None:
    """`stream-replicator replicate --config=FILE --pid FILE`: both streams in one process, the pid
    file while it runs, exit 0 on SIGTERM."""
    names = [rig.name("CLI"), rig.name("CLI")]
    for name in names:
        await rig.sjs.add_stream(StreamConfig(name=name, subjects=[f"{name.lower()}.>"]))
        for i in range(20):
            await rig.sjs.publish(f"{name.lower()}.x", str(i).encode())
    path = tmp_path / "sr.yaml"
    log = tmp_path / "sr.log"
    path.write_text(yaml.safe_dump(rig.config(*(rig.stream(n) for n in names), loglevel="info", logfile=str(log))))
    pid = tmp_path / "sr.pid"
    proc = subprocess.Popen([sys.executable, "-m", "replicator", "--debug", "replicate", f"--config={path}",
                             "--pid", str(pid)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        for name in names:
            assert await rig.wait_count(name, 20, within=30) == 20
        assert pid.read_text() == f"{proc.pid}\n"
        consumers = {n: (await rig.sjs.consumer_info(n, "SR_SITE")).name for n in names}
        assert set(consumers.values()) == {"SR_SITE"}
    finally:
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=30)[0].decode()
    assert proc.returncode == 0, output
    assert not pid.exists()
    lines = [json.loads(line) for line in log.read_text().splitlines()]  # `logfile`: JSON lines, as the Go tool
    assert {line["level"] for line in lines} >= {"debug", "info"}  # `--debug` wins over `loglevel`
    assert f"replicating 2 stream(s): {names[0]}_SITE, {names[1]}_SITE" in [line["message"] for line in lines]
