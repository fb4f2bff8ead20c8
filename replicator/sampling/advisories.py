"""Advisories: tell a central site which senders are new, silent, back, or gone, without their data.

Only the elected leader of a topic advises, and every decision is taken from the state store, not
from transitions it happened to witness: a sender is announced `new` until the store carries its
ANNOUNCED mark, `timeout` until the store carries the timed-out last-seen time, and so on. So a
new leader picks up exactly where the old one stopped, and an advisory is marked in the store only
after it was published. The one gap (published, then the leader died before marking) is closed by
`event_id`: it is derived from (replicator, topic, value, event, episode), sent as `Nats-Msg-Id`,
and JetStream drops the re-send as a duplicate.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import time
from collections.abc import Callable
from functools import cache
from importlib import resources
from typing import Any

import nats.errors
import nats.js.errors
import orjson
from nats.aio.client import Client

from replicator.config.model import Profile
from replicator.observe.metrics import WorkerMetrics
from replicator.sampling.keys import key_spec
from replicator.sampling.state.protocol import StateStore
from replicator.sampling.state.records import ANNOUNCED, Sender, scan_interval
from replicator.transport.grouped import GroupedPublisher
from replicator.transport.header_block import encode as encode_headers
from replicator.transport.jetstream import PublishError
from replicator.transport.tasks import cancel_and_wait

log = logging.getLogger(__name__)

SCHEMA_ID = "https://choria.io/schemas/sr/v1/age_advisory.json"  # the legacy tool's value: its consumers keep working
V2_PROTOCOL = "io.choria.sr.v2.age_advisory"
"""The Go Stream Replicator's AgeAdvisoryV2 (`advisory.format: v2`), for its existing consumers."""
EVENTS = ("new", "timeout", "recover", "expire")
RETRIES = 10
STREAM_RECHECK = 30.0
PUBLISH_TIMEOUT = 2.0
JUDGE_WITHIN = 30.0  # at most this long on the stream's time before a blind spot ends (`judge_now`)
CONCURRENCY = 512  # advisories in flight: a fleet's cold start owes one `new` per sender, each a publish and a
# KV mark, so eight at a time (two round trips each) left them a minute behind 100,000 copies
BATCH = 128  # advisories a worker takes from the queue at once, their publishes (then their marks) written together


@cache
def schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) shipped in the package: replicator/schemas/age_advisory.json."""
    text = resources.files("replicator").joinpath("schemas/age_advisory.json").read_text()
    return dict(json.loads(text))


def event_id(replicator: str, topic: str, value: str, event: str, episode: float) -> str:
    """Deterministic per episode, so every retry and every leader names an advisory the same way.

    The episode is the record's time that identifies it: first seen for new/expire (one life),
    the timed-out last-seen time for timeout/recover (one silence).
    """
    raw = "\x1f".join((replicator, topic, value, event, str(round(episode * 1000))))
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def episode_of(event: str, sender: Sender) -> float:
    if event in ("new", "expire"):
        return sender.first
    if event == "timeout":
        return sender.seen
    return sender.adv


def build_advisory(
    event: str, value: str, sender: Sender, now: float, *, inspect: str, replicator: str, topic: str
) -> dict[str, Any]:
    """The advisory document; `age` of a `recover` is how long the sender had been silent."""
    age = sender.seen - sender.adv if event == "recover" else now - sender.seen
    return {
        "$schema": SCHEMA_ID,
        "event_id": event_id(replicator, topic, value, event, episode_of(event, sender)),
        "event": event,
        "inspect": inspect,
        "value": value,
        "age": max(0, int(age)),
        "seen": max(0, int(sender.seen)),
        "replicator": replicator,
        "topic": topic,
        "timestamp": max(0, int(now)),
    }


def build_advisory_v2(
    event: str, value: str, sender: Sender, now: float, *, inspect: str, replicator: str, topic: str
) -> dict[str, Any]:
    """The Go tool's AgeAdvisoryV2 document (same facts; `event_id` is our deterministic one)."""
    v1 = build_advisory(event, value, sender, now, inspect=inspect, replicator=replicator, topic=topic)
    return {
        "protocol": V2_PROTOCOL,
        "event_id": v1["event_id"],
        "inspect_field": inspect,
        "age": v1["age"] if sender.seen > 0 else -1,  # Go encodes its whole float64 seconds as integers
        "seen": v1["seen"],
        "replicator": replicator,
        "timestamp": v1["timestamp"],
        "event": event,
        "value": value,
    }


_SUBJECT_UNSAFE = str.maketrans({" ": "_", "\t": "_", "*": "_", ">": "_", "\r": "_", "\n": "_"})


def advisory_subject(template: str, event: str, value: str) -> str:
    """`%s` -> the event, `%v` -> the sender's value (characters a subject cannot hold become `_`)."""
    if "%" not in template:
        return template
    return template.replace("%s", event).replace("%v", value.translate(_SUBJECT_UNSAFE) or "_")


def encode_advisory(advisory: dict[str, Any]) -> bytes:
    """Compact JSON: orjson's (a fleet's cold start owes one per sender); the standard library's,
    escaping, for a value orjson refuses (a lone surrogate from a header read leniently)."""
    try:
        return orjson.dumps(advisory)
    except orjson.JSONEncodeError:
        return json.dumps(advisory, separators=(",", ":")).encode()


def default_retry_delay(attempt: int) -> float:
    """0.25 s doubling to 5 s: ten retries span about half a minute."""
    return min(0.25 * 2**attempt, 5.0)


class Advisor:
    """Runs on the leader only: scans the store for timeout/expire, publishes new/timeout/recover/expire."""

    def __init__(
        self,
        profile: Profile,
        store: StateStore,
        publish_nc: Client,
        metrics: WorkerMetrics,
        *,
        replicator_name: str,
        clock: Callable[[], float] = time.time,
        retries: int = RETRIES,
        retry_delay: Callable[[int], float] = default_retry_delay,
        concurrency: int = CONCURRENCY,
        judging: Callable[[], bool] | None = None,
        wall: Callable[[], float] | None = None,
    ) -> None:
        settings = profile.settings
        if settings.advisory is None or not settings.age:
            raise ValueError(f"topic {profile.profile!r} has no advisory configured")
        self.store = store
        self.nc = publish_nc
        self.js = publish_nc.jetstream()
        self.metrics = metrics
        self.clock = clock
        # The stream clock's word on whether silence can be judged now (`clock.py`): not while a
        # backlog that no message of has been read yet stands between the replicator and the present.
        self.judging = judging
        # A new leader's wait is wall time (other processes' refreshes travel in it), not the clock
        # above: on the stream's time a restart's backlog would hold every timeout until it is read.
        self.wall = wall or clock
        self.subject = settings.advisory.target
        self.format = settings.advisory.format
        self.reliable = settings.advisory.reliable
        self.build = build_advisory_v2 if self.format == "v2" else build_advisory
        self.inspect = key_spec(settings)
        self.topic = settings.topic
        self.replicator = replicator_name
        self.age = float(settings.age)
        self.timeout_age = settings.advisory_age
        self.interval = scan_interval(settings)
        self.grace = store.resolution
        self.retries = retries
        self.retry_delay = retry_delay
        self.concurrency = concurrency
        self._active = False
        self._timeouts_from = math.inf
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._scan_now = asyncio.Event()
        self._streams: dict[str, tuple[str | None, float]] = {}  # subject -> (capturing stream, checked at)
        # Advisories given up on, per event (the Go-format metrics label errors by event).
        self.errors_by_event = dict.fromkeys(EVENTS, 0)
        # Published but not yet marked in the store (e.g. the KV is down): not published again.
        self._unmarked: dict[str, str] = {}
        # JetStream publishes of the workers' advisories, written together each turn of the loop.
        self._grouped: GroupedPublisher | None = None

    # -- life cycle and leadership
    async def start(self) -> None:
        self._grouped = GroupedPublisher(self.nc, PUBLISH_TIMEOUT)
        await self._grouped.start()
        self.store.add_listener(self._poke)
        self._tasks.append(asyncio.create_task(self._scanner(), name="advisor-scan"))
        for n in range(max(1, self.concurrency // BATCH)):
            self._tasks.append(asyncio.create_task(self._worker(), name=f"advisor-{n}"))

    async def stop(self) -> None:
        self._active = False
        await cancel_and_wait(self._tasks)
        self._tasks.clear()
        if self._grouped is not None:
            await self._grouped.stop()

    @property
    def active(self) -> bool:
        return self._active

    def set_active(self, active: bool) -> None:
        """Leadership changed. A new leader waits one resolution interval before declaring anyone
        silent: last-seen refreshes of the other processes must reach its cache first."""
        if active and not self._active:
            self._active = True
            self._timeouts_from = self.wall() + self.grace
            self._scan_now.set()
        elif not active and self._active:
            self._active = False
            self._timeouts_from = math.inf
            self._drop_queue()

    def _drop_queue(self) -> None:
        self._unmarked.clear()
        while not self._queue.empty():
            key = self._queue.get_nowait()
            self._queued.discard(key)
            self._queue.task_done()

    def _poke(self, key: str) -> None:
        if self._active:
            self._enqueue(key)

    def _enqueue(self, key: str) -> None:
        if key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    # -- deciding
    def next_event(self, sender: Sender | None, now: float) -> str | None:
        """The advisory this sender is owed now, from its record alone."""
        if sender is None:
            return None
        silent = now - sender.seen
        if silent >= self.age:
            return "expire" if self._settled() else None
        if not sender.announced:
            return "new"
        if sender.adv > 0 and sender.seen - sender.adv >= self.grace:
            # Back after a timeout: a real return comes at least the advisory age after the timed-out
            # last-seen time; a difference below the store's resolution is the KV's millisecond
            # rounding of a time this process holds exactly, not a message.
            return "recover"
        if sender.adv == 0 and self.timeout_age is not None and silent >= self.timeout_age and self._settled():
            return "timeout"
        return None

    def _settled(self) -> bool:
        """Silence may be claimed: the leader's wait is over and the stream clock can judge."""
        return self.wall() >= self._timeouts_from and (self.judging is None or self.judging())

    async def scan(self) -> int:
        """One pass over every tracked sender; queues those owed an advisory. Returns how many."""
        if not self._active:
            return 0
        for key in [k for k in self._unmarked if self.store.get(k) is None]:
            del self._unmarked[key]
        now = self.clock()
        found = 0
        for n, key in enumerate(self.store.keys()):
            if key not in self._queued and self.next_event(self.store.get(key), now):
                self._enqueue(key)
                found += 1
            if n % 2000 == 1999:
                await asyncio.sleep(0)
        return found

    async def judge_now(self) -> None:
        """Advise what every sender is owed at this moment of the clock, and wait (a bounded time)
        until it is published: the stream clock calls it before it ends a blind spot, so the
        silences the backlog revealed are advised with a time inside it."""
        if not self._active:
            return
        await self.scan()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.drain(), JUDGE_WITHIN)

    async def drain(self) -> None:
        """Wait until everything queued has been published (tests, shutdown)."""
        await self._queue.join()

    async def _scanner(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._scan_now.wait(), self.interval)
            self._scan_now.clear()
            try:
                await self.scan()
            except Exception:  # the scanner outlives a failed scan (logged with its traceback): advising goes on
                log.exception("advisory scan failed")

    async def _worker(self) -> None:
        """Takes what is queued, up to `BATCH`, and advises it all at once: the publishes start in
        one turn of the loop and go out in one write (`GroupedPublisher`), their acks come back
        together, and so do the marks. One at a time per worker, a cold start's advisories and
        marks went out a few per write, a system call each."""
        while True:
            batch = [await self._queue.get()]
            while len(batch) < BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            if len(batch) == 1:
                await self._advise_one(batch[0])
            else:
                await asyncio.gather(*(self._advise_one(key) for key in batch))

    async def _advise_one(self, key: str) -> None:
        try:
            await self._advise(key)
        except Exception:  # one sender's advisory failing (logged) must not stop the others
            log.exception("advisory for %r failed", key)
        finally:
            self._queued.discard(key)
            self._queue.task_done()

    async def _advise(self, key: str) -> None:
        """Publish what `key` is owed (possibly new, then timeout), marking the store after each."""
        for _ in range(len(EVENTS)):
            if not self._active:
                return
            now = self.clock()
            sender = self.store.get(key)
            event = self.next_event(sender, now)
            if event in ("timeout", "expire"):  # silence is claimed from the KV, not a stale cache
                sender = await self.store.refresh(key)
                event = self.next_event(sender, now)
            if event is None or sender is None:
                return
            if event == "expire" and (not sender.announced or now - sender.seen >= 2 * self.age):
                await self.store.forget(key, sender)  # never announced, or stale state: forget quietly
                return
            advisory = self.build(
                event, key, sender, now, inspect=self.inspect, replicator=self.replicator, topic=self.topic
            )
            if self._unmarked.get(key) != advisory["event_id"]:
                if await self.publish(advisory):
                    self.metrics.advisories[event].inc()
                else:
                    self.metrics.advisories_errors.inc()
                    self.errors_by_event[event] += 1
                self._unmarked[key] = advisory["event_id"]
            if not await self._mark(key, event, sender):
                return  # the next scan retries the mark, not the publish
            self._unmarked.pop(key, None)

    async def _mark(self, key: str, event: str, sender: Sender) -> bool:
        if event == "new":
            return await self.store.annotate(key, flags=sender.flags | ANNOUNCED)
        if event == "timeout":
            return await self.store.annotate(key, adv=sender.seen)
        if event == "recover":
            return await self.store.annotate(key, adv=0.0)
        await self.store.forget(key, sender)  # if it came back meanwhile, it is a new life
        self._unmarked.pop(key, None)
        return False

    # -- publishing
    async def _capturing_stream(self, subject: str) -> str | None:
        """The stream that stores the advisory subject, if any (re-checked every 30 s and on errors)."""
        mono = time.monotonic()
        stream, checked = self._streams.get(subject, (None, -math.inf))
        if mono - checked >= STREAM_RECHECK:
            try:
                stream = await self.js.find_stream_name_by_subject(subject)
            except nats.js.errors.NotFoundError:
                stream = None
            if len(self._streams) > 10_000:  # a `%v` subject per sender: keep the cache bounded
                self._streams.clear()
            self._streams[subject] = (stream, mono)
        return stream

    async def publish(self, advisory: dict[str, Any]) -> bool:
        """Publish to the advisory's subject (`%s`/`%v` filled in), then log and give up on failure.

        `reliable: true`: a JetStream publish (deduplicated by Nats-Msg-Id), retried with backoff.
        `reliable: false`: one core publish, as the Go tool does. Unset: JetStream when a stream
        captures the subject, else core, retried.
        """
        subject = advisory_subject(self.subject, advisory["event"], advisory["value"])
        data = encode_advisory(advisory)
        headers = {"Nats-Msg-Id": advisory["event_id"]}
        error: BaseException | None = None
        retries = 0 if self.reliable is False else self.retries
        for attempt in range(retries + 1):
            try:
                jetstream = self.reliable or (self.reliable is None and await self._capturing_stream(subject))
                if jetstream:
                    assert self._grouped is not None
                    await self._grouped.publish(subject, encode_headers(headers), data)
                else:
                    await self.nc.publish(subject, data, headers=headers)
                    await self.nc.flush(timeout=2)
                return True
            except (nats.errors.Error, nats.js.errors.Error, PublishError, TimeoutError, OSError) as err:
                error = err
                self._streams.pop(subject, None)
            if attempt < retries:
                await asyncio.sleep(self.retry_delay(attempt))
        log.error(
            "advisory %s for %r to %s not published after %d retries, dropped: %s",
            advisory["event"], advisory["value"], subject, retries, error,
        )
        return False
