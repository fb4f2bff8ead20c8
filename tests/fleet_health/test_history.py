"""Each run's site counts rebuilt from the events table (the report's history), on small hand-made
histories; the job's own tables are the reference in test_job.py."""

from __future__ import annotations

import pyarrow as pa

from replicator.fleet_health.history import Counts, site_counts

# (replicator, value, event, timestamp, sequence, run)
Event = tuple[str, str, str, int, int, int]


def table(events: list[Event]) -> pa.Table:
    names = ("replicator", "value", "event", "timestamp", "sequence", "run")
    return pa.table({n: pa.array([e[i] for e in events], pa.string() if i < 3 else pa.int64())
                     for i, n in enumerate(names)})


def test_no_events_no_sites() -> None:
    assert site_counts(table([]), [1, 2]) == {}


def test_counts_carry_over_runs_without_events() -> None:
    events = [("ams", "n1", "new", 10, 1, 1), ("ams", "n2", "new", 11, 2, 1), ("fra", "n1", "new", 12, 3, 1)]
    assert site_counts(table(events), [1, 2, 3]) == {
        "ams": [Counts(2, 2, 0, 0)] * 3,
        "fra": [Counts(1, 1, 0, 0)] * 3,
    }


def test_state_follows_the_latest_advisory_by_time_then_sequence() -> None:
    events = [
        ("ams", "n1", "new", 10, 1, 1),
        ("ams", "n2", "new", 10, 2, 1),
        ("ams", "n1", "timeout", 20, 3, 2),
        ("ams", "n1", "expire", 40, 4, 3),
        ("ams", "n1", "recover", 30, 5, 3),  # late: older than the expiry folded in the same run
        ("ams", "n2", "timeout", 50, 6, 3),
        ("ams", "n2", "recover", 50, 7, 3),  # same second: the sequence decides
        ("ams", "n2", "timeout", 45, 8, 4),  # late, across runs: n2 stays healthy
        ("ams", "n1", "new", 60, 9, 5),  # back after expiring
    ]
    assert site_counts(table(events), [1, 2, 3, 4, 5]) == {"ams": [
        Counts(2, 2, 0, 0), Counts(2, 1, 1, 0), Counts(2, 1, 0, 1), Counts(2, 1, 0, 1), Counts(2, 2, 0, 0)]}
    assert Counts(2, 1, 1, 0).availability == 0.5 and Counts(1, 0, 0, 1).availability is None
