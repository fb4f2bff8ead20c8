"""Source-side loss: which jumps are loss (`covers`), how a range is split by reason, the note."""

from __future__ import annotations

import pytest

from replicator.copier.loss import Note, covers, gap_advisory
from replicator.copier.removals import Removals


@pytest.mark.parametrize(("topic", "subjects", "whole"), [
    ("fleet.>", ["fleet.>"], True),
    ("fleet.>", ["fleet.a", "fleet.b.*"], True),
    (">", ["a", "b.>"], True),
    ("fleet.*", ["fleet.a", "fleet.b"], True),
    ("fleet.*", ["fleet.>"], False),  # fleet.a.b is in the stream, not in the copy
    ("fleet.a", ["fleet.>"], False),
    ("fleet.>", ["fleet.>", "other.>"], False),
    ("fleet.>", ["fleet"], False),  # `>` needs a token after it
    ("fleet.>", [], False),  # a mirror: its subjects are its origin's
    (">", [], True),
])
def test_a_jump_is_loss_only_when_the_copy_takes_the_whole_stream(topic: str, subjects: list[str],
                                                                  whole: bool) -> None:
    assert covers(topic, subjects) is whole


def test_a_range_is_split_into_purge_delete_and_limits() -> None:
    removals = Removals(None, "S")  # type: ignore[arg-type]  # classify needs no connection
    assert removals.classify(10, 19) == {"limits": 10, "purge": 0, "delete": 0}
    removals.purged_through = 14
    removals._note_delete(12)
    removals._note_delete(17)
    assert removals.classify(10, 19) == {"limits": 4, "purge": 4, "delete": 2}
    assert removals.classify(20, 29) == {"limits": 10, "purge": 0, "delete": 0}


def test_the_note_round_trips_and_reads_as_report_shows_it() -> None:
    note = Note(3299, {"limits": 3299}, 1702, 5000, "limits", "2026-11-28T22:40:01Z")
    assert Note.parse(note.text()) == note
    assert note.summary() == "3,299 (limits); last 1702..5000 at 2026-11-28T22:40:01Z"
    assert Note(5, {"limits": 3, "purge": 2}, 1, 5, "limits", "t").summary() == "5 (limits 3, purge 2); last 1..5 at t"
    assert Note.parse("not json") is None and Note.parse(None) is None


def test_the_gap_advisory_is_named_by_its_range() -> None:
    one = gap_advisory(replicator="dc1", topic="t", stream="S", identity="i", first=1, last=9, by={"limits": 9},
                       before_ns=1_000_000_000, after_ns=2_000_000_000, now=3.0)
    again = gap_advisory(replicator="dc1", topic="t", stream="S", identity="i", first=1, last=9, by={"limits": 9},
                         before_ns=0, after_ns=0, now=4.0)
    assert one["event_id"] == again["event_id"] and one["count"] == 9
    assert (one["from"], one["until"], again["from"]) == (1.0, 2.0, None)


def test_gap_and_blind_spot_advisories_match_their_shipped_schemas() -> None:
    import json
    from importlib import resources

    import jsonschema

    from replicator.sampling.blind import blind_spot_advisory

    def schema(name: str) -> dict[str, object]:
        return dict(json.loads(resources.files("replicator").joinpath(f"schemas/{name}").read_text()))

    gap = gap_advisory(replicator="dc1", topic="t", stream="S", identity="i", first=1, last=9, by={"limits": 9},
                       before_ns=1_000_000_000, after_ns=0, now=3.0)
    jsonschema.validate(gap, schema("gap_advisory.json"))
    spot = blind_spot_advisory(replicator="dc1", topic="t", since=1.5, until=9.25, now=10.0)
    jsonschema.validate(spot, schema("blind_spot_advisory.json"))
