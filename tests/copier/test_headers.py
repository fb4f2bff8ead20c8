"""The header policy table, decided per header name and target features (pure: no server needed;
`test_control_headers.py` runs every rule against real servers)."""

from __future__ import annotations

import pytest

from replicator.copier.headers import NO_FEATURES, RENAMED, RULES, Action, HeaderPolicy, TargetFeatures, decide

ALL = TargetFeatures(ttl=True, rollup=True, counter=True)

# (header, action on a plain target, action on a target with every feature)
EXPECTED = [
    ("Nats-Msg-Id", Action.RENAME, Action.RENAME),
    ("Nats-Expected-Stream", Action.STRIP, Action.STRIP),
    ("Nats-Expected-Last-Sequence", Action.STRIP, Action.STRIP),
    ("Nats-Expected-Last-Subject-Sequence", Action.STRIP, Action.STRIP),
    ("Nats-Expected-Last-Subject-Sequence-Subject", Action.STRIP, Action.STRIP),
    ("Nats-Expected-Last-Msg-Id", Action.STRIP, Action.STRIP),
    ("Nats-Batch-Id", Action.STRIP, Action.STRIP),
    ("Nats-Batch-Sequence", Action.STRIP, Action.STRIP),
    ("Nats-Batch-Commit", Action.STRIP, Action.STRIP),
    ("Nats-Required-Api-Level", Action.STRIP, Action.STRIP),
    ("Nats-TTL", Action.RENAME, Action.HONOUR),
    ("Nats-Rollup", Action.RENAME, Action.HONOUR),
    ("Nats-Incr", Action.RENAME, Action.HONOUR),
    ("Nats-Counter-Sources", Action.RENAME, Action.RENAME),
    ("Nats-Marker-Reason", Action.RENAME, Action.RENAME),
    ("Nats-Schedule", Action.RENAME, Action.RENAME),
    ("Nats-Schedule-Target", Action.RENAME, Action.RENAME),
    ("Nats-Schedule-TTL", Action.RENAME, Action.RENAME),
    ("Nats-Schedule-Time-Zone", Action.RENAME, Action.RENAME),
    ("Nats-Scheduler", Action.RENAME, Action.RENAME),
    ("Nats-Schedule-Next", Action.RENAME, Action.RENAME),
    ("Nats-Stream-Source", Action.RENAME, Action.RENAME),
    ("Nats-Trace-Dest", Action.KEEP, Action.KEEP),  # stored disabled by the server; not a publish control
    ("nats-ttl", Action.KEEP, Action.KEEP),  # the server matches names case-sensitively
    ("X-Nats-TTL", Action.KEEP, Action.KEEP),
    ("KV-Operation", Action.KEEP, Action.KEEP),
]


@pytest.mark.parametrize(("name", "plain", "featured"), EXPECTED)
def test_every_interpreted_header_has_a_decision(name: str, plain: Action, featured: Action) -> None:
    assert decide(name, NO_FEATURES).action is plain
    assert decide(name, ALL).action is featured


def test_every_rule_is_exercised_and_explained() -> None:
    for rule in RULES:
        probe = rule.name.rstrip("*") + ("X" if rule.name.endswith("*") else "")
        assert decide(probe, ALL).rule is rule, rule
        assert rule.why and rule.mirror, rule


def test_apply_plain_target_renames_strips_and_keeps() -> None:
    applied = HeaderPolicy().apply({
        "X-Site": "ams", "Nats-Msg-Id": "agent-1", "Nats-TTL": "1h", "Nats-Batch-Id": "b", "Nats-Incr": "+2",
        "Nats-Expected-Last-Sequence": "4", "Nats-Required-Api-Level": "2",
    })
    assert applied.headers == {"X-Site": "ams", RENAMED + "Nats-Msg-Id": "agent-1", RENAMED + "Nats-TTL": "1h",
                               RENAMED + "Nats-Incr": "+2"}
    assert not applied.empty_payload and applied.chainable


def test_apply_counter_target_honours_the_increment_unchained_without_payload() -> None:
    applied = HeaderPolicy(ALL).apply({"Nats-Incr": "+2", "Nats-Counter-Sources": "{}", "Nats-TTL": "5m"})
    assert applied.headers == {"Nats-Incr": "+2", RENAMED + "Nats-Counter-Sources": "{}", "Nats-TTL": "5m"}
    assert applied.empty_payload and not applied.chainable


def test_a_subject_delete_marker_is_inert_even_where_features_are_on() -> None:
    marker = {"Nats-Marker-Reason": "MaxAge", "Nats-TTL": "1m0s", "Nats-Rollup": "sub"}
    applied = HeaderPolicy(ALL).apply(marker)
    assert applied.headers == {RENAMED + k: v for k, v in marker.items()}


def test_a_previous_hops_msg_id_is_dropped_and_the_publishers_original_survives_every_hop() -> None:
    hop1 = HeaderPolicy().apply({"Nats-Msg-Id": "agent-1"}).headers
    hop1.update({"Stream-Replicator-Source": "S 1 city 1 w1", "Nats-Msg-Id": "w1:1"})
    hop2 = HeaderPolicy().apply(hop1).headers
    assert hop2[RENAMED + "Nats-Msg-Id"] == "agent-1" and "Nats-Msg-Id" not in hop2


def test_messages_without_server_headers_take_the_fast_path_unchanged() -> None:
    original = {"X-A": "1", "Content-Type": "application/json"}
    applied = HeaderPolicy(ALL).apply(original)
    assert applied.headers == original and applied.headers is not original


def _block(headers: list[tuple[str, str]]) -> bytes:
    return ("NATS/1.0\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n").encode()


def _lines(head: bytes) -> list[tuple[str, str]]:
    """A block's header lines as (name, value), parsed as nats-py reads them."""
    out = []
    for line in head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            out.append((name.strip().decode(), value.strip().decode()))
    return out


CASES = [
    [],
    [("X-Site", "ams"), ("Content-Type", "application/json")],
    [("X-Site", "ams"), ("Nats-Msg-Id", "agent-1"), ("Nats-TTL", "1h"), ("Nats-Batch-Id", "b"), ("Nats-Incr", "+2"),
     ("Nats-Expected-Last-Sequence", "4"), ("Nats-Required-Api-Level", "2")],
    [("Nats-Incr", "+2"), ("Nats-Counter-Sources", "{}"), ("Nats-TTL", "5m")],
    [("Nats-Marker-Reason", "MaxAge"), ("Nats-TTL", "1m0s"), ("Nats-Rollup", "sub")],
    [("Stream-Replicator-Orig-Nats-Msg-Id", "agent-1"), ("Stream-Replicator-Source", "S 1 city 1 w1"),
     ("Nats-Msg-Id", "w1:1"), ("X-Other", "x")],
    [("Nats-Schedule", "@every 1m"), ("Nats-Schedule-Target", "a.b"), ("Nats-Stream-Source", "x"),
     ("X-Value", "Nats-TTL: in a value"), ("nats-ttl", "lower case, not the server's")],
]


@pytest.mark.parametrize("features", [NO_FEATURES, ALL], ids=["plain", "featured"])
@pytest.mark.parametrize("headers", CASES)
def test_the_block_policy_decides_as_the_dict_policy(headers: list[tuple[str, str]], features: TargetFeatures) -> None:
    """Same table, same decisions: the raw-bytes path keeps, drops and renames what the dict path
    does (a previous hop's provenance goes: each hop adds its own)."""
    policy = HeaderPolicy(features)
    by_dict = policy.apply(dict(headers) or None)
    by_block = policy.apply_block(_block(headers) if headers else None)
    wanted = {k: v for k, v in by_dict.headers.items() if k != "Stream-Replicator-Source"}
    assert dict(_lines(by_block.head)) == wanted
    assert (by_block.empty_payload, by_block.chainable) == (by_dict.empty_payload, by_dict.chainable)
    assert by_block.head.startswith(b"NATS/1.0\r\n") and by_block.head.endswith(b"\r\n")


def test_the_block_policy_keeps_every_other_byte() -> None:
    """Repeated names, their order, padding and odd spacing survive; only the policy's lines change."""
    block = b"NATS/1.0\r\nX-A: 1\r\nNats-TTL:5m\r\nX-A:   2  \r\nX-B:x\r\n\r\n"
    assert HeaderPolicy().apply_block(block).head == (
        b"NATS/1.0\r\nX-A: 1\r\nStream-Replicator-Orig-Nats-TTL:5m\r\nX-A:   2  \r\nX-B:x\r\n")
    assert HeaderPolicy(ALL).apply_block(block).head == block[:-2]
