"""What the Go tool's users already consume keeps working: V2 advisories on the source cluster, on
the templated subjects, reliable (JetStream, deduplicated) or not (core); and a `/metrics` scrape
with every `choria_stream_replicator_*` family of its published list, labelled as it labels them."""

from __future__ import annotations

import asyncio
import functools
import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from nats.js.api import StreamConfig

from replicator.cli import advisories as advisories_command
from replicator.cli.main import build_parser
from tests.gocompat.conftest import Rig, scrape

pytestmark = pytest.mark.timeout(90)

V2_FIELDS = {"protocol", "event_id", "inspect_field", "age", "seen", "replicator", "timestamp", "event", "value"}

# The Go tool's metrics (research section 5): name -> (type, labels).
GO_TOOL_METRICS: dict[str, tuple[str, set[str]]] = {
    **{f"replicator_{n}": ("counter", {"stream", "replicator", "worker"}) for n in (
        "total_messages", "total_bytes", "handler_error_count", "too_old_messages", "copied_messages",
        "copied_bytes", "skipped_messages", "skipped_bytes", "meta_parse_failed_count", "ack_failed_count",
        "consumer_recreated")},
    "replicator_processing_time_seconds": ("summary", {"stream", "replicator", "worker"}),
    "replicator_stream_sequence": ("gauge", {"stream", "replicator", "worker"}),
    "tracker_total_items": ("gauge", {"stream", "replicator", "worker"}),
    "tracker_seen_by_gossip": ("gauge", {"stream", "replicator", "worker"}),
    "limiter_messages_without_limit_field_count": ("counter", {"limiter", "stream", "replicator"}),
    "limiter_messages_copy_forced_count": ("counter", {"limiter", "stream", "replicator"}),
    "advisor_total_messages": ("counter", {"advisory", "stream", "replicator"}),
    "advisor_publish_errors": ("counter", {"advisory", "stream", "replicator"}),
    "election_campaigns": ("counter", {"election", "identity", "state", "replicator"}),
    "election_leader": ("gauge", {"election", "identity", "replicator"}),
    "election_interval_seconds": ("gauge", {"election", "identity", "replicator"}),
    "heartbeat_subjects_count": ("gauge", {"replicator"}),
    "heartbeat_published_count": ("counter", {"replicator", "subject"}),
    "heartbeat_published_error_count": ("counter", {"replicator", "subject"}),
    "heartbeat_publish_time": ("summary", {"replicator", "subject"}),
    "heartbeat_paused": ("gauge", {"replicator", "hostname"}),
}


def v2_schema() -> dict[str, Any]:
    return dict(json.loads(resources.files("replicator").joinpath("schemas/age_advisory_v2.json").read_text()))


def families(text: str) -> dict[str, tuple[str, list[dict[str, str]]]]:
    """`choria_stream_replicator_*` families in a scrape: name -> (type, label sets of its samples)."""
    out: dict[str, tuple[str, list[dict[str, str]]]] = {}
    for name, kind in re.findall(r"^# TYPE choria_stream_replicator_(\w+) (\w+)$", text, re.MULTILINE):
        out[name] = (kind, [])
    for sample, labels in re.findall(r"^choria_stream_replicator_(\w+)\{([^}]*)\} \S+$", text, re.MULTILINE):
        family = sample if sample in out else re.sub(r"_(sum|count)$", "", sample)
        out[family][1].append(dict(re.findall(r'(\w+)="([^"]*)"', labels)))
    return out


@pytest.mark.parametrize("reliable", [True, False], ids=["reliable", "core"])
async def test_v2_advisories_and_the_go_metric_families(rig: Rig, reliable: bool, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    src = rig.name("ADV")
    root = src.lower()
    await rig.sjs.add_stream(StreamConfig(name=src, subjects=[f"{root}.>"]))
    advisories = f"{root}adv"
    if reliable:  # the Go docs' set-up: a stream on the source stores the advisories
        await rig.sjs.add_stream(StreamConfig(name=f"{src}_ADVISORIES", subjects=[f"{advisories}.>"]))
    seen: list[tuple[str, dict[str, Any], dict[str, str]]] = []
    sub = await rig.source.subscribe(f"{advisories}.>", cb=functools.partial(_collect, seen))  # the Go tool's consumers
    heartbeat = f"{root}hb.beat"
    await rig.sjs.add_stream(StreamConfig(name=f"{src}_HB", subjects=[f"{root}hb.>"]))
    stream = rig.stream(src, inspect_field="sender", inspect_duration="3s", warn_duration="1s",
                        leader_election_name="site-a",
                        advisory={"subject": f"{advisories}.%s.%v", "reliable": reliable})
    config = rig.config(stream, heartbeats={"url": rig.sites.source.url, "interval": "300ms",
                                            "subjects": [{"subject": heartbeat}]})
    async with rig.replicating(config, monitor=True) as process:
        for _ in range(100):  # elected (the copier waits for it), then the first senders
            if process.readiness()[0]:
                break
            await asyncio.sleep(0.1)
        for sender in ("n1.example.net", "n2"):
            await rig.sjs.publish(f"{root}.reg", json.dumps({"sender": sender}).encode())
        for _ in range(100):  # n2 timed out (after warn_duration): then it comes back, a recover
            if f"{advisories}.timeout.n2" in [s for s, _, _ in seen]:
                break
            await asyncio.sleep(0.05)
        await rig.sjs.publish(f"{root}.reg", json.dumps({"sender": "n2"}).encode())
        for _ in range(80):
            if any(s == f"{advisories}.expire.n1.example.net" for s, _, _ in seen):
                break
            await asyncio.sleep(0.1)
        assert process.monitor_port is not None
        text = await asyncio.to_thread(scrape, process.monitor_port)
    await sub.unsubscribe()

    subjects = [s for s, _, _ in seen]
    n1 = [s for s in subjects if s.endswith("n1.example.net")]
    assert n1 == [f"{advisories}.{e}.n1.example.net" for e in ("new", "timeout", "expire")], subjects
    n2 = [s.split(".")[1] for s in subjects if s.endswith(".n2")]
    assert n2[:3] == ["new", "timeout", "recover"], subjects
    validator = jsonschema.Draft202012Validator(v2_schema())
    for subject, doc, headers in seen:
        validator.validate(doc)
        assert set(doc) == V2_FIELDS and doc["protocol"] == "io.choria.sr.v2.age_advisory"
        assert (doc["replicator"], doc["inspect_field"]) == ("SITE", "sender")
        assert subject == f"{advisories}.{doc['event']}.{doc['value']}"
        assert headers.get("Nats-Msg-Id") == doc["event_id"]
    if reliable:
        stored = await rig.read(f"{src}_ADVISORIES", rig.source)
        assert sorted(m.subject for m in stored) == sorted(subjects)
        # `stream-replicator advisories` finds them behind the templated subject.
        path = tmp_path / "sr.yaml"
        path.write_text(yaml.safe_dump(config))
        capsys.readouterr()
        args = build_parser().parse_args(["advisories", "--config", str(path), "--topic", f"{src}_SITE", "--json"])
        assert await advisories_command.run(args) == 0
        shown = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [(d["event"], d["value"]) for d in shown] == [(d["event"], d["value"]) for _, d, _ in seen]

    found = families(text)
    missing = sorted(set(GO_TOOL_METRICS) - set(found))
    assert not missing, f"not in the scrape: {missing}"
    for name, (kind, labels) in GO_TOOL_METRICS.items():
        got_kind, samples = found[name]
        assert got_kind == kind and samples, name
        assert all(set(s) == labels for s in samples), (name, samples[:2])
    stream_labels = {"stream": src, "replicator": "SITE", "worker": "SITE"}
    assert stream_labels in found["replicator_total_messages"][1]
    assert {"limiter": "memory", "stream": "SR_SITE", "replicator": "SITE"} in found[
        "limiter_messages_copy_forced_count"][1]
    assert re.search(rf'^choria_stream_replicator_replicator_total_messages\{{stream="{src}",replicator="SITE",'
                     r'worker="SITE"\} 3\.0$', text, re.MULTILINE), text
    assert re.search(rf'^choria_stream_replicator_advisor_total_messages\{{advisory="expire",stream="{src}",'
                     r'replicator="SITE"\} [1-9]', text, re.MULTILINE)
    assert re.search(rf'^choria_stream_replicator_election_leader\{{election="SR_SITE_{src}",identity="site-a",'
                     r'replicator="SITE"\} 1\.0$', text, re.MULTILINE)
    assert re.search(rf'^choria_stream_replicator_heartbeat_published_count\{{replicator="SITE",'
                     rf'subject="{heartbeat}"\}} [1-9]', text, re.MULTILINE)
    print(f"advisories ({'reliable' if reliable else 'core'}): {len(seen)} V2 advisories, subjects {subjects}; "
          f"{len(found)} choria_stream_replicator_* families scraped")


async def _collect(seen: list[tuple[str, dict[str, Any], dict[str, str]]], msg: Any) -> None:
    seen.append((msg.subject, json.loads(msg.data), dict(msg.headers or {})))
