"""`spec.target`'s limits reach a created target stream through both engines, named as the worker
config's `target_*` keys; a source's count and size limits never do (fan-in)."""

from __future__ import annotations

import yaml
from replication_operator.build import worker_config
from replication_operator.engine import entry as native
from replication_operator.engine.entry import Start

from replicator.transport.streams import fan_in_limits, tighter_limits
from tests.operator.test_operator_engine import LEAF, spec_of

TARGET = {"maxMsgs": 5_000_000, "maxBytes": 8 << 30, "maxAge": "7d", "maxMsgsPerSubject": 10, "discard": "new"}
SOURCE = {"name": "FLEET", "subjects": ["fleet.>"], "max_msgs": 1000, "max_bytes": 1 << 20, "max_msg_size": 4096,
          "max_msgs_per_subject": 5, "max_age": 3600 * 10**9, "storage": "file", "retention": "limits",
          "discard": "new"}


def test_the_target_limits_reach_the_worker_config() -> None:
    topic = yaml.safe_load(worker_config.build_worker_config(
        spec_of(engine="replicator", target=TARGET)).text)["topics"]["fleet"]
    assert {k: topic[k] for k in topic if k.startswith("target_max") or k == "target_discard"} == {
        "target_max_msgs": 5_000_000, "target_max_bytes": 8 << 30, "target_max_age": "7d",
        "target_max_msgs_per_subject": 10, "target_discard": "new"}
    plain = yaml.safe_load(worker_config.build_worker_config(spec_of(engine="replicator")).text)["topics"]["fleet"]
    assert not [k for k in plain if k.startswith("target_max") or k == "target_discard"]


def test_a_natively_created_target_takes_the_same_limits() -> None:
    spec = spec_of(target={"subjectPrefix": "hub", **TARGET})
    config = native.target_config(SOURCE, spec, "HUB", native.build_entry(spec, LEAF, "FLEET", Start()), "FLEET")
    assert (config["max_msgs"], config["max_bytes"], config["max_msgs_per_subject"]) == (5_000_000, 8 << 30, 10)
    assert config["max_age"] == 7 * 86400 * 10**9 and config["discard"] == "new" and config["max_msg_size"] == -1
    plain = spec_of(target={"subjectPrefix": "hub"})
    config = native.target_config(SOURCE, plain, "HUB", native.build_entry(plain, LEAF, "FLEET", Start()), "FLEET")
    assert (config["max_msgs"], config["max_bytes"], config["max_msgs_per_subject"], config["max_msg_size"]) == (
        -1, -1, -1, -1)
    assert config["max_age"] == 3600 * 10**9 and config["discard"] == "old"  # the source's age; discard old
    assert (config["storage"], config["retention"]) == ("file", "limits")


def test_what_is_left_of_the_source_and_what_is_tighter() -> None:
    _limits, left = fan_in_limits(SOURCE, {"max_msgs": None})
    assert left == ["max_msgs 1000", "max_bytes 1048576", "max_msgs_per_subject 5", "max_msg_size 4096"]
    assert fan_in_limits(SOURCE, {"max_msgs": 1000})[1][:1] == ["max_bytes 1048576"]  # wanted equal: taken
    source = {"max_msgs": 1000, "max_bytes": -1, "max_msgs_per_subject": -1, "max_age": 60.0}
    target = {"max_msgs": 500, "max_bytes": 1 << 30, "max_msgs_per_subject": -1, "max_age": 120.0}
    assert tighter_limits(target, source) == ["max_msgs 500 (the source's: 1000)",
                                              "max_bytes 1073741824 (the source's: none)"]
    assert tighter_limits(source, source) == [] and tighter_limits({"max_msgs": -1}, source) == []
