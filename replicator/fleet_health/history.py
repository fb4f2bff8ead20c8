"""The job's Parquet output read back for pictures: per run, each site's counts and the advisories it
took in; and the node table of the last committed run.

Read with PyArrow alone (no Spark: a report must open in seconds). Only committed runs count (see
`store.py`). The site table of every run is rebuilt from the history: a node's state after run n is
the state of its latest advisory (by timestamp, then stream sequence) among the events of runs up to
n, exactly as the job folds them, so each run's rebuilt counts equal the site table that run wrote.
The rebuild is columnar (sorts and one cumulative maximum), not a loop over advisories.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

STATES = ("healthy", "timeout", "expired")
EVENT_STATE = {"new": "healthy", "recover": "healthy", "timeout": "timeout", "expire": "expired"}
_RUN_DIR = re.compile(r"^run=(\d+)$")


class HistoryError(Exception):
    """The output root holds no committed fleet-health run (or cannot be read)."""


@dataclass(frozen=True)
class Run:
    """One line of the run log, plus its first-seen advisories by event."""

    run: int
    run_time: int
    read: int
    events: int
    duplicates: int
    malformed: int
    by_event: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Counts:
    nodes: int
    healthy: int
    timeout: int
    expired: int

    @property
    def availability(self) -> float | None:
        """healthy / (healthy + timeout), as the job defines it; None when no node reports."""
        reporting = self.healthy + self.timeout
        return self.healthy / reporting if reporting else None


@dataclass(frozen=True)
class History:
    output: str
    stream: str
    runs: list[Run]
    sites: dict[str, list[Counts]]  # site -> its counts after each run, aligned with `runs`
    nodes: list[dict[str, Any]]  # the node table of the last run

    def fleet(self, index: int = -1) -> Counts:
        rows = [counts[index] for counts in self.sites.values()]
        return Counts(*(sum(getattr(c, f) for c in rows) for f in ("nodes", "healthy", "timeout", "expired")))


def _filesystem(output: str) -> tuple[pafs.FileSystem, str]:
    """A local path or a URI PyArrow can open (`s3a://` is Hadoop's name for `s3://`)."""
    if "://" not in output:
        return pafs.LocalFileSystem(), os.path.abspath(output)
    uri = "s3://" + output.removeprefix("s3a://") if output.startswith("s3a://") else output
    fs, path = pafs.FileSystem.from_uri(uri)
    return fs, path


def _runs_under(fs: pafs.FileSystem, path: str) -> list[int]:
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except OSError as err:
        raise HistoryError(f"cannot list {path}: {err}") from None
    found = (_RUN_DIR.match(info.base_name) for info in infos if info.type == pafs.FileType.Directory)
    return sorted(int(m.group(1)) for m in found if m)


def _last_committed(fs: pafs.FileSystem, root: str) -> int | None:
    state = f"{root}/state"
    committed = [n for n in _runs_under(fs, state)
                 if fs.get_file_info(f"{state}/run={n}/_COMMITTED").type == pafs.FileType.File]
    return committed[-1] if committed else None


def _events(fs: pafs.FileSystem, root: str, upto: int) -> pa.Table:
    columns = ["replicator", "value", "event", "timestamp", "sequence", "run"]
    if not _runs_under(fs, f"{root}/events"):
        return pa.table({c: pa.array([], pa.string() if c in ("replicator", "value", "event") else pa.int64())
                         for c in columns})
    table = pq.read_table(f"{root}/events", filesystem=fs, columns=columns, partitioning="hive",
                          filters=[("run", "<=", upto)])
    return table.set_column(table.schema.get_field_index("run"), "run", pc.cast(table["run"], pa.int64()))


def _shifted_differs(*columns: pa.Array) -> pa.Array:
    """True at i when row i+1 differs from row i in any column (the last row: True)."""
    if len(columns[0]) == 0:
        return pa.array([], pa.bool_())
    differs = None
    for col in columns:
        step = pc.not_equal(col[1:], col[:-1])
        differs = step if differs is None else pc.or_(differs, step)
    assert differs is not None
    return pa.concat_arrays([differs.combine_chunks() if isinstance(differs, pa.ChunkedArray) else differs,
                             pa.array([True])])


def site_counts(events: pa.Table, runs: list[int]) -> dict[str, list[Counts]]:
    """Each site's counts after each of `runs` (ascending), from the de-duplicated events of those runs."""
    if events.num_rows == 0:
        return {}
    n = events.num_rows
    node = pc.dictionary_encode(pc.binary_join_element_wise(events["replicator"], events["value"], "\x00"))
    node_id = pc.cast(node.combine_chunks().indices, pa.int64())
    # Global order of the events as the job folds them, and each event's rank in it.
    order = pc.sort_indices(events, [("timestamp", "ascending"), ("sequence", "ascending")])
    rank = pc.sort_indices(order)  # the inverse permutation
    t = pa.table({"node": node_id, "run": events["run"], "rank": pc.cast(rank, pa.int64())})
    by_node_run = pc.sort_indices(t, [("node", "ascending"), ("run", "ascending"), ("rank", "ascending")])
    t = t.take(by_node_run)
    # Nodes come in ascending blocks, so one running maximum of node * n + rank is, within each block,
    # the node's latest event so far (over its earlier runs too).
    key = pc.add(pc.multiply(t["node"], n), t["rank"])
    latest = pc.subtract(pc.cumulative_max(key), pc.multiply(t["node"], n))
    event_of = events["event"].take(order.take(latest))
    site_of = events["replicator"].take(by_node_run)
    node_col, run_col = t["node"].combine_chunks(), t["run"].combine_chunks()
    last = _shifted_differs(node_col, run_col)  # the end of a (node, run) block: the state after that run
    state = pc.take(pa.array([EVENT_STATE[e] for e in ("new", "recover", "timeout", "expire")]),
                    pc.index_in(event_of, pa.array(["new", "recover", "timeout", "expire"])))
    after = pa.table({"node": node_col, "run": run_col, "site": site_of, "state": state}).filter(last)
    # A node's state before this run: its previous block's, if that block is the same node's.
    prev_state = pa.concat_arrays([pa.array([None], pa.string()), after["state"].combine_chunks()[:-1]])
    same_node = pa.concat_arrays([pa.array([False]), pc.equal(after["node"][1:], after["node"][:-1])
                                  .combine_chunks()]) if after.num_rows else pa.array([], pa.bool_())
    prev_state = pc.if_else(same_node, prev_state, pa.scalar(None, pa.string()))
    changed = after.append_column("prev", prev_state).filter(
        pc.or_kleene(pc.invert(same_node), pc.not_equal(after["state"], prev_state)))
    arrivals = changed.select(["site", "run", "state"])
    arrivals = arrivals.append_column("delta", pa.array([1] * arrivals.num_rows, pa.int64()))
    departures = changed.filter(pc.is_valid(changed["prev"])).select(["site", "run", "prev"]).rename_columns(
        ["site", "run", "state"])
    departures = departures.append_column("delta", pa.array([-1] * departures.num_rows, pa.int64()))
    deltas = pa.concat_tables([arrivals, departures]).group_by(["site", "run", "state"]).aggregate(
        [("delta", "sum")])
    step: dict[tuple[str, int, str], int] = {
        (s, r, st): d for s, r, st, d in zip(*(deltas[c].to_pylist() for c in ("site", "run", "state", "delta_sum")),
                                             strict=True)}
    out: dict[str, list[Counts]] = {}
    for site in sorted({s for s, _, _ in step}):
        current = dict.fromkeys(STATES, 0)
        series = []
        for run in runs:
            for st in STATES:
                current[st] += step.get((site, run, st), 0)
            series.append(Counts(sum(current.values()), current["healthy"], current["timeout"], current["expired"]))
        out[site] = series
    return out


def _by_event(events: pa.Table) -> dict[int, dict[str, int]]:
    if events.num_rows == 0:
        return {}
    grouped = events.group_by(["run", "event"]).aggregate([("sequence", "count")])
    found: dict[int, dict[str, int]] = {}
    for run, event, count in zip(*(grouped[c].to_pylist() for c in ("run", "event", "sequence_count")), strict=True):
        found.setdefault(int(run), {})[str(event)] = int(count)
    return found


def read_history(output: str) -> History:
    """Everything the report shows, from the output root of `run_fleet_health` (`--output`)."""
    fs, root = _filesystem(output)
    last = _last_committed(fs, root)
    if last is None:
        raise HistoryError(f"no committed fleet-health run under {output} (is it the job's --output?)")
    try:
        log = pq.read_table(f"{root}/state/run={last}/runs", filesystem=fs).sort_by("run").to_pylist()
        events = _events(fs, root, last)
        nodes = pq.read_table(f"{root}/state/run={last}/nodes", filesystem=fs).to_pylist()
    except (OSError, pa.ArrowException) as err:
        raise HistoryError(f"cannot read the fleet-health output under {output}: {err}") from None
    by_event = _by_event(events)
    runs = [Run(run=int(r["run"]), run_time=int(r["run_time"]), read=int(r["read"]), events=int(r["events"]),
                duplicates=int(r["duplicates"]), malformed=int(r["malformed"]),
                by_event=by_event.get(int(r["run"]), {})) for r in log]
    return History(output=output, stream=str(log[-1]["stream"]) if log else "", runs=runs,
                   sites=site_counts(events, [r.run for r in runs]), nodes=nodes)
