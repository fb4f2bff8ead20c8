"""Fault-test harness: continuous publishing, whole-stream reads, completeness checks, the results row.

The ground truth for "complete" is the source stream itself, read at the end: the publisher may
publish a message twice on the source when an acknowledgement is lost in an outage, and that is
the source's business. The replicator's contract is that the target holds exactly the source's
messages (provenance sequence by sequence, payload and headers unchanged), in order and once each
in ordered mode, all of them in scaled mode.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import time
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import ServiceUnavailableError

from replicator.copier.headers import HeaderPolicy
from replicator.copier.provenance import MSG_ID, PROVENANCE, parse_provenance


@dataclass
class StoredMsg:
    seq: int  # stream sequence in the stream it was read from
    subject: str
    data: bytes
    headers: dict[str, str]

    @property
    def writer(self) -> str | None:
        prov = parse_provenance(self.headers.get(PROVENANCE))
        return prov.writer if prov else None

    @property
    def source_seq(self) -> int:
        """The source sequence this target message was copied from (provenance header)."""
        prov = parse_provenance(self.headers.get(PROVENANCE))
        assert prov is not None, f"message {self.seq} has no provenance header: {self.headers}"
        return prov.seq


async def read_stream(nc: Client, stream: str, within: float = 60.0) -> list[StoredMsg]:
    """Every message of a stream in stream order, through an ephemeral no-ack pull consumer."""
    js = nc.jetstream(timeout=10)
    total = (await js.stream_info(stream)).state.messages
    if total == 0:
        return []
    config = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL,
                            inactive_threshold=30.0, max_waiting=8)
    psub = await js.pull_subscribe(">", durable=None, stream=stream, config=config)
    out: list[StoredMsg] = []
    deadline = time.monotonic() + within
    try:
        while len(out) < total and time.monotonic() < deadline:
            try:
                msgs = await psub.fetch(min(2000, total - len(out)), timeout=2)
            except TimeoutError:
                continue
            except ServiceUnavailableError:  # a clustered stream's reading consumer still moving after a restart
                await asyncio.sleep(0.2)
                continue
            for m in msgs:
                seq = m.metadata.sequence.stream
                out.append(StoredMsg(seq, m.subject, m.data, dict(m.headers or {})))
    finally:
        with contextlib.suppress(Exception):
            await psub.unsubscribe()
    assert len(out) == total, f"read {len(out)} of {total} messages of {stream} in {within}s"
    return out


async def stream_count(nc: Client, stream: str) -> int:
    try:
        return int((await nc.jetstream(timeout=2).stream_info(stream)).state.messages)
    except Exception:  # server down or stream missing: unknown
        return -1


async def wait_count(nc: Client, stream: str, count: int, within: float) -> float | None:
    """Seconds until the stream holds `count` messages; None if it never did `within` seconds."""
    start = time.monotonic()
    while time.monotonic() - start < within:
        if await stream_count(nc, stream) >= count:
            return time.monotonic() - start
        await asyncio.sleep(0.1)
    return None


async def acked_upto(nc: Client, stream: str, consumer: str) -> int:
    """The consumer's ack floor (stream sequence); 0 while it cannot be read (not created yet,
    server down)."""
    try:
        info = await nc.jetstream(timeout=2).consumer_info(stream, consumer)
    except Exception:
        return 0
    return info.ack_floor.stream_seq or 0 if info.ack_floor else 0


async def wait_acked(nc: Client, stream: str, consumer: str, upto: int, within: float) -> float | None:
    """Seconds until the consumer's ack floor reaches `upto`; None if it never did `within` seconds."""
    start = time.monotonic()
    while time.monotonic() - start < within:
        if await acked_upto(nc, stream, consumer) >= upto:
            return time.monotonic() - start
        await asyncio.sleep(0.1)
    return None


class ContinuousPublisher:
    """Publishes indexed messages to the source at a steady rate, through outages.

    Each message carries its index in the payload (and in the `X-Index` header); a publish that
    fails (server down, acknowledgement lost) is retried later, so every index reaches the source
    at least once. Indices fall behind during an outage and catch up at four times the rate after.
    """

    def __init__(self, nc: Client, *, rate: float = 400.0, subject: str = "fleet.n{i}", size: int = 64,
                 tick: float = 0.05, make_body: Callable[[int], bytes] | None = None) -> None:
        self.nc = nc
        self.js = nc.jetstream(timeout=2.0)
        self.rate = rate
        self.subject = subject
        self.size = size
        self.tick = tick
        self.make_body = make_body
        self.next_index = 0
        self.backlog: deque[int] = deque()
        self.acked: set[int] = set()
        self.failures = 0
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    def body(self, i: int) -> bytes:
        if self.make_body is not None:
            return self.make_body(i)
        return f"{i:08d}".encode().ljust(self.size, b".")

    async def _one(self, i: int) -> bool:
        try:
            await self.js.publish(self.subject.format(i=i % 100), self.body(i), headers={"X-Index": str(i)})
        except Exception:  # any failure: publish it again later
            return False
        self.acked.add(i)
        return True

    async def _run(self) -> None:
        per_tick = max(1, int(self.rate * self.tick))
        began = time.monotonic()
        while not self._stop.is_set():
            started = time.monotonic()
            due = int((started - began) * self.rate)  # by the clock: an outage builds a backlog
            while self.next_index < due:
                self.backlog.append(self.next_index)
                self.next_index += 1
            batch = [self.backlog.popleft() for _ in range(min(len(self.backlog), per_tick * 4))]
            results = await asyncio.gather(*(self._one(i) for i in batch))
            failed = [i for i, ok in zip(batch, results, strict=True) if not ok]
            if failed:
                self.failures += len(failed)
                self.backlog.extendleft(reversed(failed))
                await asyncio.sleep(0.5)
            else:
                await asyncio.sleep(max(0.0, self.tick - (time.monotonic() - started)))

    def start(self) -> ContinuousPublisher:
        self._task = asyncio.ensure_future(self._run())
        return self

    async def stop(self, drain_timeout: float = 60.0) -> None:
        """Stop producing new indices, then publish the backlog so every index is on the source."""
        self._stop.set()
        if self._task is not None:
            await self._task
        deadline = time.monotonic() + drain_timeout
        while self.backlog and time.monotonic() < deadline:
            batch = [self.backlog.popleft() for _ in range(min(len(self.backlog), 200))]
            results = await asyncio.gather(*(self._one(i) for i in batch))
            failed = [i for i, ok in zip(batch, results, strict=True) if not ok]
            if failed:
                self.backlog.extendleft(reversed(failed))
                await asyncio.sleep(0.5)
        assert not self.backlog, f"{len(self.backlog)} messages could not be published to the source"


@dataclass
class Outcome:
    """What the final check found; `row()` is the results-table line."""

    scenario: str
    messages: int  # messages in the source stream (the ones that had to arrive)
    copied: int  # messages in the target stream
    lost: int
    duplicated: int
    out_of_order: int
    mismatched: int  # copies whose payload, subject or original headers differ from the source
    recover_s: float | None
    faults: int = 1
    notes: str = ""
    extra: dict[str, object] = field(default_factory=dict)

    def row(self) -> tuple[str, ...]:
        recover = "-" if self.recover_s is None else f"{self.recover_s:.1f}"
        return (self.scenario, str(self.faults), str(self.messages), str(self.lost), str(self.duplicated),
                str(self.out_of_order), recover, self.notes)


EXPECTED = "Nats-Expected-"  # the ordered chain's own check, stored with each copy


def compare(scenario: str, source: list[StoredMsg], target: list[StoredMsg], *, recover_s: float | None,
            faults: int = 1, notes: str = "", expected_subject: str | None = None,
            writer: str | None = None) -> Outcome:
    """Target against source: lost, duplicated, out of order, and byte-exact payload and headers (as
    the header policy for a target without TTLs, roll-ups or counters makes them). `writer`: only
    the copies of that writer count (a target that several sources fan into)."""
    if writer is not None:
        target = [m for m in target if m.writer == writer]
    by_seq = {m.seq: m for m in source}
    seqs = [m.source_seq for m in target]
    unique = set(seqs)
    lost = len(set(by_seq) - unique)
    duplicated = len(seqs) - len(unique)
    out_of_order = sum(1 for a, b in itertools.pairwise(seqs) if b <= a)
    mismatched = 0
    for m in target:
        original = by_seq.get(m.source_seq)
        if original is None:
            mismatched += 1
            continue
        headers = {k: v for k, v in m.headers.items()
                   if k not in (PROVENANCE, MSG_ID) and not k.startswith(EXPECTED)}
        wanted = HeaderPolicy().apply(original.headers).headers
        if m.data != original.data or headers != wanted or (
            expected_subject is None and m.subject != original.subject
        ):
            mismatched += 1
    outcome = Outcome(scenario, len(source), len(target), lost, duplicated, out_of_order, mismatched,
                      recover_s, faults, notes)
    outcome.extra["lost_seqs"] = sorted(set(by_seq) - unique)[:40]
    counts = collections.Counter(seqs)
    outcome.extra["duplicated_seqs"] = sorted(s for s, n in counts.items() if n > 1)[:40]
    return outcome


def scrape(port: int, timeout: float = 2.0) -> str:
    """The replicator's Prometheus exposition from its `monitor` port."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as resp:
        return resp.read().decode()


def metric(text: str, name: str, /, **labels: str) -> float | None:
    """One sample's value from an exposition (labels must all match, `name` among them); None if
    absent."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{", 1)[0] != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return None


async def wait_metric(port: int, name: str, want: float, within: float, /, **labels: str) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if metric(await asyncio.to_thread(scrape, port), name, **labels) == want:
                return True
        await asyncio.sleep(0.2)
    return False


def log_text(path: Path, start: int = 0) -> str:
    return path.read_bytes()[start:].decode(errors="replace") if path.exists() else ""


async def wait_log(path: Path, text: str, within: float, start: int = 0) -> float | None:
    """Seconds until `text` appears in a log file after byte offset `start`; None if it never did."""
    began = time.monotonic()
    while time.monotonic() - began < within:
        if text in await asyncio.to_thread(log_text, path, start):
            return time.monotonic() - began
        await asyncio.sleep(0.2)
    return None


def log_size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0
