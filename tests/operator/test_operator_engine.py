"""The engine choice and the native engine's source entry, as pure functions: spec in, choice or
entry out (the real servers are in test_operator_native.py)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import yaml
from replication_operator.build import worker_config
from replication_operator.engine import choice as engine
from replication_operator.engine import entry as native
from replication_operator.engine import health, mirror
from replication_operator.engine.entry import Route, Start
from replication_operator.metrics import replica_values
from replication_operator.model import status as st
from replication_operator.model.spec import SpecError, parse_spec

from tests.operator import helpers as h

LEAF = Route(api="$JS.leaf.API", deliver=None, via='JetStream domain "leaf"')
NOW = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def body(**spec: Any) -> dict[str, Any]:
    source = {"url": "nats://leaf:4222", "stream": "FLEET", **spec.pop("source", {"domain": "leaf"})}
    target = {"url": "nats://hub:4222", **spec.pop("target", {})}
    return {
        "apiVersion": "streamreplicator.io/v1alpha1", "kind": "StreamReplication",
        "metadata": {"name": "fleet", "namespace": "ns", "uid": "u1", "generation": 1},
        "spec": {"topic": "fleet.>", "source": source, "target": target, **spec},
    }


def spec_of(**spec: Any) -> Any:
    return parse_spec(body(**spec))


# ---- the spec and the CRD ----
def test_spec_reads_the_engine_and_how_the_target_reaches_the_source() -> None:
    spec = spec_of()
    assert spec.engine == "auto" and spec.source.domain == "leaf"
    spec = spec_of(engine="native", source={"apiPrefix": "JS.site.API", "deliverPrefix": "deliver.site"})
    assert (spec.engine, spec.source.api_prefix, spec.source.deliver_prefix) == (
        "native", "JS.site.API", "deliver.site")
    with pytest.raises(SpecError, match="domain or apiPrefix, not both"):
        spec_of(source={"domain": "leaf", "apiPrefix": "JS.site.API"})
    with pytest.raises(SpecError, match="deliverPrefix needs"):
        spec_of(source={"deliverPrefix": "d"})


@pytest.mark.parametrize("spec, message", [
    ({"engine": "native", "source": {}}, "engine native needs source.domain or source.apiPrefix"),
    ({"engine": "native", "maxAge": "1h"}, "engine native cannot sample"),
    ({"engine": "native", "deadLetter": "poison"}, "engine native cannot sample"),
    ({"source": {"domain": "leaf", "apiPrefix": "JS.x.API"}}, "source takes domain or apiPrefix, not both"),
    ({"source": {"deliverPrefix": "d.x"}}, "source.deliverPrefix needs source.apiPrefix"),
    ({"engine": "sometimes"}, "engine"),
])
def test_the_crd_refuses_what_no_engine_can_run(spec: dict[str, Any], message: str) -> None:
    errors = h.cr_errors(body(**spec))
    assert any(message in e for e in errors), errors


def test_the_crd_accepts_each_engine() -> None:
    for spec in ({}, {"engine": "native"}, {"engine": "replicator", "source": {}},
                 {"engine": "native", "source": {"apiPrefix": "JS.x.API", "deliverPrefix": "d.x"}}):
        assert h.cr_errors(body(**spec)) == [], spec


# ---- the choice ----
@pytest.mark.parametrize("spec, chosen, reason, problem", [
    ({"engine": "replicator"}, engine.REPLICATOR, engine.REQUESTED, False),
    ({"sampling": {"inspect": "sender", "age": "5m"}}, engine.REPLICATOR, engine.NEEDS_REPLICATOR, False),
    ({"maxAge": "1h"}, engine.REPLICATOR, engine.NEEDS_REPLICATOR, False),
    ({"deadLetter": "poison"}, engine.REPLICATOR, engine.NEEDS_REPLICATOR, False),
    ({"heartbeats": {"subjects": [{"subject": "hb"}]}}, engine.REPLICATOR, engine.NEEDS_REPLICATOR, False),
    ({"target": {"subjectRemove": "fleet."}}, engine.REPLICATOR, engine.NEEDS_REPLICATOR, False),
    ({"source": {}}, engine.REPLICATOR, engine.NO_ROUTE, False),
    ({"engine": "native", "maxAge": "1h"}, engine.NATIVE, engine.NATIVE_UNSUPPORTED, True),
    ({"engine": "native", "source": {}}, engine.NATIVE, engine.NATIVE_UNSUPPORTED, True),
])
def test_choices_that_need_no_probe(spec: dict[str, Any], chosen: str, reason: str, problem: bool) -> None:
    resource = body(**spec)
    choice = engine.before_probe(parse_spec(resource))
    assert choice is not None and (choice.engine, choice.reason, choice.problem) == (chosen, reason, problem)


def test_choices_after_the_probe() -> None:
    auto, explicit = spec_of(), spec_of(engine="native")
    assert engine.before_probe(auto) is None and engine.before_probe(explicit) is None
    reached = engine.after_probe(auto, LEAF, "FLEET", None)
    assert (reached.engine, reached.reason) == (engine.NATIVE, engine.SOURCE_REACHABLE)
    assert "stream FLEET through JetStream domain \"leaf\"" in reached.message
    failed = engine.after_probe(auto, LEAF, None, "no responders")
    assert (failed.engine, failed.reason, failed.problem) == (engine.REPLICATOR, engine.SOURCE_UNREACHABLE, False)
    failed = engine.after_probe(explicit, LEAF, None, "no responders")
    assert (failed.engine, failed.reason, failed.problem) == (engine.NATIVE, engine.NATIVE_UNAVAILABLE, True)
    repeat = engine.would_repeat(100, 250, "FLEET_HUB")
    assert "copy 150 messages again" in repeat
    assert engine.after_probe(auto, LEAF, "FLEET", None, repeat).engine == engine.REPLICATOR
    assert engine.after_probe(explicit, LEAF, "FLEET", None, repeat).problem
    # The choice survives a restart through its condition's reason.
    assert engine.engine_of(engine.SOURCE_REACHABLE, auto) == engine.NATIVE
    assert engine.engine_of(engine.REQUESTED, explicit) == engine.NATIVE
    assert engine.engine_of(engine.NO_ROUTE, auto) == engine.REPLICATOR
    cond = engine.condition(reached, 4)
    assert (cond["type"], cond["status"], cond["observedGeneration"]) == ("Engine", "True", 4)


# ---- the entry ----
@pytest.mark.parametrize("topic, target, mapping", [
    ("fleet.>", {}, ("fleet.>", "fleet.>")),
    ("fleet.>", {"subjectPrefix": "hub"}, ("fleet.>", "hub.fleet.>")),
    ("fleet.*.x", {"subjectPrefix": "a.b"}, ("fleet.*.x", "a.b.fleet.*.x")),
    ("acme.cmdb.node1", {"subjectRemove": "acme."}, ("acme.cmdb.node1", "cmdb.node1")),
    ("acme.cmdb.>", {"subjectRemove": "acme."}, None),  # text in a wildcard token would go too
])
def test_subject_rewrites_as_transforms(topic: str, target: dict[str, Any], mapping: Any) -> None:
    resource = body(target=target)
    resource["spec"]["topic"] = topic
    assert native.subject_mapping(parse_spec(resource)) == mapping


def test_entries_in_the_servers_json() -> None:
    plain = native.build_entry(spec_of(), LEAF, "FLEET", Start())
    assert plain == {"name": "FLEET", "opt_start_seq": 1, "filter_subject": "fleet.>",
                     "external": {"api": "$JS.leaf.API"}}
    resource = body(target={"subjectPrefix": "hub"})
    resource["spec"]["topic"] = "fleet.*.>"
    imported = Route(api="JS.site.API", deliver="deliver.site", via="")
    entry = native.build_entry(parse_spec(resource), imported, "FLEET", Start(time="2026-01-01T00:00:00Z"))
    assert entry == {"name": "FLEET", "opt_start_time": "2026-01-01T00:00:00Z",
                     "subject_transforms": [{"src": "fleet.*.>", "dest": "hub.fleet.{{wildcard(1)}}.>"}],
                     "external": {"api": "JS.site.API", "deliver": "deliver.site"}}
    assert native.identity(entry) == ("FLEET", "JS.site.API", ("fleet.*.>",))


@pytest.mark.parametrize("start, expected", [
    ({}, Start(sequence=1)),
    ({"sequence": 42}, Start(sequence=42)),
    ({"atEnd": True}, Start(sequence=1001)),
    ({"delta": "1h"}, Start(time="2026-01-02T02:04:05.000000Z")),
    ({"time": "2025-12-31T23:00:00Z"}, Start(time="2025-12-31T23:00:00.000000Z")),
])
def test_spec_start_resolved_once(start: dict[str, Any], expected: Start) -> None:
    assert native.spec_start(spec_of(start=start), NOW, source_last_seq=1000) == expected
    assert Start.from_status(expected.status()) == expected


def test_our_entry_beside_foreign_ones() -> None:
    foreign = {"name": "OTHER", "filter_subject": "other.>", "external": {"api": "$JS.leaf.API", "deliver": ""}}
    same_stream_other_filter = {"name": "FLEET", "filter_subject": "fleet.eu.>", "external": {"api": "$JS.leaf.API"}}
    ours = native.build_entry(spec_of(), LEAF, "FLEET", Start(sequence=5))
    added = native.with_entry([foreign, same_stream_other_filter], ours, [])
    assert added == [foreign, same_stream_other_filter, ours]
    assert native.with_entry(added, ours, []) is None, "nothing to change"
    # As the server returns it: an empty deliver prefix, and a start NATS no longer reads: unchanged.
    live = [foreign, same_stream_other_filter, {**ours, "external": {"api": "$JS.leaf.API", "deliver": ""},
                                                "opt_start_seq": 1}]
    assert native.with_entry(live, ours, []) is None
    # Edited by hand (its destination): put back, the foreign ones untouched, its start kept.
    edited = {**live[2], "filter_subject": None, "subject_transforms": [{"src": "fleet.>", "dest": "x.>"}]}
    fixed = native.with_entry([foreign, edited, same_stream_other_filter], ours, [])
    assert fixed == [foreign, {**ours, "opt_start_seq": 1}, same_stream_other_filter]
    # The spec moved to another topic: the entry recorded earlier is replaced, not left behind.
    moved = native.build_entry(spec_of(topic="fleet.eu.>"), LEAF, "FLEET", Start(sequence=9))
    replaced = native.with_entry([foreign, ours], moved, [native.identity(ours)])
    assert replaced == [foreign, moved]
    assert native.without_entry(replaced, [native.identity(moved)]) == [foreign]
    assert native.without_entry([foreign], [native.identity(moved)]) is None


def test_the_servers_source_header_names_our_entry() -> None:
    entry = native.build_entry(spec_of(target={"subjectPrefix": "hub"}), LEAF, "FLEET", Start())
    hashed = native.api_hash("$JS.leaf.API")
    assert len(hashed) == 8 and hashed.isalnum()
    header = f"FLEET:{hashed} 77 fleet.> hub.fleet.> fleet.n3 YOYkSOgu"
    assert native.delivered_sequence(header, entry) == 77
    other_domain = native.api_hash("$JS.other.API")
    assert native.delivered_sequence(f"FLEET:{other_domain} 77 fleet.> hub.fleet.> s", entry) is None
    assert native.delivered_sequence("FLEET 77 fleet.> > fleet.n3", entry) is None
    assert native.delivered_sequence(None, entry) is None


def test_status_fields_like_the_replication_report() -> None:
    seen = health.source_health({"name": "FLEET", "lag": 12, "active": 2_000_000_000})
    last, seen = health.progress(None, seen, NOW)
    assert health.status_fields(seen, last) == {"lag": 12, "lastActive": "2026-01-02T03:04:05Z"}
    failing = health.source_health({"name": "FLEET", "active": -1, "error": {"code": 503, "description": "gone"}})
    assert health.status_fields(failing, last) == {"lag": 0} and failing.error == "gone" and not failing.heard
    conditions = st.conditions_for_native([], st.Native(configured=True, stream="HUB", source="FLEET"), 2)
    assert [(c["type"], c["status"], c["reason"]) for c in conditions] == [
        ("Ready", "True", st.SOURCING), ("Progressing", "False", st.SOURCE_CONFIGURED),
        ("Degraded", "False", "Healthy")]
    failing = st.conditions_for_native([], st.Native(configured=True, stream="HUB", source="FLEET", error="gone"), 2)
    assert [(c["type"], c["status"], c["reason"]) for c in failing][::2] == [
        ("Ready", "False", st.SOURCE_ERROR), ("Degraded", "True", st.SOURCE_ERROR)]
    stopping = st.conditions_for_native([], st.Native(stopping=True), 2)
    assert stopping[0]["reason"] == st.STOPPING_REPLICATOR


def test_native_readiness_comes_from_both_ends() -> None:
    """NATS's lag freezes while the link is down: the operator counts from the source's last sequence
    and the last one delivered, and tracks when the entry last moved. No error, moving or caught up
    within maxInactive, lag within maxLag: Ready; stalled is Degraded, a lag only not Ready."""
    bounds = spec_of(native={"maxLag": 100, "maxInactive": "30s"}).native
    linked = health.source_health({"lag": 0, "active": 500_000_000})
    assert health.measured(linked, 900, 1000).lag == 100 and health.measured(linked, 900, None).lag == 0
    assert health.covers("fleet.>", ["fleet.>"]) and not health.covers("fleet.a", ["fleet.>"])
    assert not health.covers("fleet.>", ["fleet.>", "other.>"]), "the other subject's messages are no lag"
    last, seen = health.progress(None, health.measured(linked, 900, 1000), NOW)
    assert seen.unready(bounds) is None and seen.current == 900
    later = NOW + dt.timedelta(seconds=45)
    still, stalled = health.progress(last, health.measured(linked, 900, 1300), later)
    assert still == last and stalled.inactive == 45
    reason, message = stalled.unready(bounds) or ("", "")
    assert reason == health.SOURCE_INACTIVE and "400 messages wait" in message and "45s" in message
    _, moving = health.progress(last, health.measured(linked, 1100, 1300), later)
    assert moving.inactive == 0 and (moving.unready(bounds) or ("",))[0] == health.LAGGING
    _, idle = health.progress(last, health.measured(linked, 900, 900), later)
    assert idle.unready(bounds) is None, "nothing to copy is not a stall"
    assert (health.source_health({"active": -1}).unready(bounds) or ("",))[0] == health.CONNECTING
    assert spec_of().native.max_lag == 100_000 and spec_of().native.max_inactive == "1m"
    view = st.Native(configured=True, stream="HUB", source="FLEET", unready=(reason, message), degrading=True)
    ready, _, degraded = st.conditions_for_native([], view, 2)
    assert (ready["status"], ready["reason"], degraded["status"]) == ("False", health.SOURCE_INACTIVE, "True")
    lagging = st.Native(configured=True, stream="HUB", source="FLEET", unready=(health.LAGGING, "behind"))
    ready, _, degraded = st.conditions_for_native([], lagging, 2)
    assert (ready["status"], ready["reason"], degraded["status"]) == ("False", health.LAGGING, "False")


def test_a_native_resource_counts_as_one_replica_ready_while_ready() -> None:
    """The replica gauges behind StreamReplicatorNotReady: no pods by design, so the Ready condition counts."""
    ready = {"engine": "native", "readyReplicas": 0, "conditions": [{"type": "Ready", "status": "True"}]}
    assert replica_values(ready, 3) == (1, 1)
    assert replica_values({**ready, "conditions": [{"type": "Ready", "status": "False"}]}, 3) == (1, 0)
    assert replica_values({"engine": "replicator", "readyReplicas": 2}, 3) == (3, 2)
    assert replica_values({}, 1) == (1, 0)


def test_a_created_target_follows_the_replicators_rules() -> None:
    source_config = {"name": "FLEET", "subjects": ["fleet.>"], "max_msgs_per_subject": 50, "storage": "file",
                     "sources": [{"name": "UP"}], "placement": {"cluster": "c1"}, "republish": {"src": ">"},
                     "metadata": {"_nats.req.level": "1", "team": "ops"}}
    spec = spec_of(target={"subjectPrefix": "hub", "stream": "FLEET_HUB"})
    entry = native.build_entry(spec, LEAF, "FLEET", Start())
    config = native.target_config(source_config, spec, "FLEET_HUB", entry, "FLEET")
    assert config["name"] == "FLEET_HUB" and config["subjects"] == ["hub.fleet.>"]
    assert config["sources"] == [entry] and config["storage"] == "file"
    assert config["max_msgs_per_subject"] == -1  # sized for one source: a target is often shared (fan-in)
    assert "placement" not in config and "republish" not in config and config["metadata"] == {"team": "ops"}
    assert "num_replicas" not in config  # the source's (none given here)


def test_target_replicas_reach_both_engines() -> None:
    """`target.replicas` sets a created target stream's replicas, natively and in the worker config."""
    spec = spec_of(target={"replicas": 3})
    entry = native.build_entry(spec, LEAF, "FLEET", Start())
    config = native.target_config({"name": "FLEET", "num_replicas": 1}, spec, "FLEET", entry, "FLEET")
    assert config["num_replicas"] == 3
    worker = worker_config.build_worker_config(spec_of(engine="replicator", target={"replicas": 3}))
    assert worker.model.topics["fleet"].target_replicas == 3
    assert yaml.safe_load(worker.text)["topics"]["fleet"]["target_replicas"] == 3
    assert "target_replicas" not in yaml.safe_load(worker_config.build_worker_config(spec_of()).text)["topics"]["fleet"]
    for bad in (0, 6, "3", True):
        with pytest.raises(SpecError, match=r"spec\.target\.replicas must be 1 to 5"):
            spec_of(target={"replicas": bad})


def test_the_worker_config_takes_the_handover() -> None:
    config = worker_config.build_worker_config(spec_of(engine="replicator"), resume_after=4096)
    assert config.model.topics["fleet"].resume_after == 4096
    assert yaml.safe_load(config.text)["topics"]["fleet"]["resume_after"] == 4096
    assert "resume_after" not in yaml.safe_load(worker_config.build_worker_config(spec_of()).text)["topics"]["fleet"]


def test_a_spec_change_that_nats_would_take_for_a_new_source() -> None:
    entry = native.build_entry(spec_of(target={"subjectPrefix": "hub"}), LEAF, "FLEET", Start())
    recorded = {"stream": "HUB", **native.identity_status(entry), "destinations": list(native.destinations(entry))}
    assert native.header_key(native.recorded_entry(recorded)) == native.header_key(entry)
    assert not native.moved(recorded, entry, "HUB")
    assert native.moved(recorded, entry, "OTHER_HUB"), "another target stream"
    assert native.moved(recorded, native.build_entry(spec_of(target={"subjectPrefix": "hub2"}), LEAF, "FLEET",
                                                     Start()), "HUB"), "another destination"
    assert not native.moved({"stream": "HUB", "start": {"sequence": 5}}, entry, "HUB"), "nothing written yet"


def test_the_mirror_form_of_a_created_target() -> None:
    """A target the resource creates is a mirror (no subjects, our entry as `mirror`) unless the spec
    asks for a source entry; promotion drops the mirror and gives it the replicator's subjects."""
    spec = spec_of(target={"subjectPrefix": "hub", "stream": "FLEET_HUB"})
    assert mirror.form_for_new_stream(spec) == (mirror.MIRROR, mirror.CREATED_ALONE)
    assert mirror.form_for_new_stream(spec_of(native={"form": "source"}))[0] == mirror.SOURCE
    assert "a mirror needs a stream of its own" in mirror.existing_reason(spec_of(native={"form": "mirror"}))
    entry = native.build_entry(spec, LEAF, "FLEET", Start())
    config = mirror.mirror_config({"name": "FLEET", "subjects": ["fleet.>"], "storage": "file"}, spec, "FLEET_HUB",
                                  entry, "FLEET")
    assert config["mirror"] == entry and "subjects" not in config and "sources" not in config
    assert config["name"] == "FLEET_HUB" and config["storage"] == "file"
    assert mirror.live_mirror(config) == entry
    promoted = mirror.promoted(config, spec)
    assert "mirror" not in promoted and promoted["subjects"] == ["hub.fleet.>"]
    assert mirror.live_mirror(promoted) is None
    assert "filter_subject" not in mirror.unfiltered(entry) and mirror.unfiltered(entry)["name"] == "FLEET"
    assert mirror.whole({"form": "mirror", "filterSubjects": [">"]})
    assert not mirror.whole({"form": "mirror", "filterSubjects": ["fleet.>"]})
    assert mirror.made_by_operator(config) and not mirror.made_by_operator({"description": "mine"})


def test_a_recreated_source_stream_is_recognised() -> None:
    assert health.recreated("2026-01-01T00:00:00Z", "2026-01-01T00:00:00Z", 500, 400) is None
    assert "created again at 2026-02-01" in (health.recreated("2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z",
                                                               500, 400) or "")
    assert "below sequence 400" in (health.recreated(None, "2026-02-01T00:00:00Z", 50, 400) or "")
    assert health.recreated(None, "2026-02-01T00:00:00Z", 50, None) is None, "nothing delivered yet"
    view = st.Native(configured=True, stream="HUB", source="FLEET", recreated="reset at 1")
    assert [(c["type"], c["status"], c["reason"]) for c in st.conditions_for_native([], view, 2)][-1] == (
        st.SOURCE_RECREATED, "True", st.REPAIRED)


def test_nats_waiting_in_vain() -> None:
    """Lag 0 from NATS, more on the source counted from both ends, nothing delivered for maxInactive."""
    bounds = spec_of(native={"maxInactive": "30s"}).native
    linked = health.source_health({"lag": 0, "active": 500_000_000})
    last, _ = health.progress(None, health.measured(linked, 900, 900), NOW)
    later = NOW + dt.timedelta(seconds=45)
    waiting = health.measured(linked, 900, 1200)
    assert "nothing arrived for 45s while the source holds 300 more" in (health.silent(last, waiting, later, bounds)
                                                                         or "")
    assert health.silent(last, waiting, NOW + dt.timedelta(seconds=10), bounds) is None, "not for maxInactive yet"
    copying = health.measured(health.source_health({"lag": 300, "active": 1}), 900, 1200)
    assert health.silent(last, copying, later, bounds) is None, "NATS knows it is behind"
    assert health.silent(last, health.measured(linked, 1000, 1200), later, bounds) is None, "it moved"
    assert health.silent(last, health.measured(linked, 900, None), later, bounds) is None, "source not read"
