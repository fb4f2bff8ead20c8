"""Limiter state stores: every tracked sender's first and last seen, last copy and advisory marks.

- `memory`: this process only; lost on restart.
- `file`: memory plus a JSON snapshot under `state_dir`, loaded on start and saved atomically
  every 30 s and on close, so a restart does not forward the whole fleet again.
- `kv`: a JetStream KV bucket on the source cluster, shared by every worker and process of the
  topic. Each process keeps a local cache fed by a KV watch, so deciding to *skip* costs no I/O.
  The KV is written only when a sender is copied (compare-and-set on the key's revision, so two
  processes never both forward one sender), and, with advisories on, when a sender's last-seen
  time would otherwise look older than the advisory age to the leader (at most once per sender
  per resolution interval, off the hot path). When the KV is unreachable the store fails open:
  it decides from its cache, copies what it cannot claim, counts `limiter_state_errors`, and
  writes its local decisions back once the KV answers again.

Senders live in parallel `array` columns indexed through one `dict[str, int]`: about 200 bytes
per sender at a million senders instead of ~600 for one Python object each.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import re
import tempfile
import time
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import nats.errors
import nats.js.errors
from nats.js import api

from replicator.config import Profile, TopicConfig
from replicator.jetstream_raw import nothing_sent
from replicator.metrics import WorkerMetrics

if TYPE_CHECKING:
    from nats.aio.msg import Msg
    from nats.js import JetStreamContext

log = logging.getLogger(__name__)

ANNOUNCED = 0x01
"""Persisted flag: the `new` advisory of this life of the sender went out."""
_PERSISTED = 0x0F
_LOCAL_NEWER = 0x40  # kv cache only: this process saw the sender after the KV's last-seen time
_DIRTY = 0x80  # kv cache only: a copy decided here while the KV was unreachable, not written yet

FILE_FORMAT = "stream-replicator/v1/limiter_state"
SAVE_INTERVAL = 30.0
KV_OP_TIMEOUT = 2.0
_WRONG_LAST_SEQUENCE = (10071, 10164)
# Three replicas cannot be placed: not clustered (10074), too few peers (10005), no room (10023).
NO_ROOM_FOR_REPLICAS = (10074, 10005, 10023)
_DELETE_OPS = ("DEL", "PURGE")
_EXPECT_LAST = api.Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value


@dataclass(frozen=True, slots=True)
class Sender:
    """One tracked sender. Times are unix seconds; `adv` is the last-seen time a `timeout`
    advisory was sent for (0: not timed out), so it doubles as that episode's identity."""

    first: float
    seen: float
    copied: float
    size: int
    adv: float = 0.0
    flags: int = 0

    @property
    def announced(self) -> bool:
        return bool(self.flags & ANNOUNCED)


@dataclass(frozen=True, slots=True)
class Observation:
    copy: bool
    new: bool


Decide = Callable[[Sender | None], bool]
"""The limiter's rule, given the sender's live record (None: new or forgotten, must return True)."""
Listener = Callable[[str], None]
"""Called with a sender the advisor may need to look at (new, or back after a timeout)."""


class StateStore(Protocol):
    """What the limiter and the advisor need from a store. One instance per process."""

    kind: str
    resolution: float
    table: SenderTable
    local: bool
    """True: only this process decides, so `insert` and `copied_now` may record copies at once;
    False (KV): copies are claimed through `observe`."""

    def __len__(self) -> int: ...
    def live_slot(self, key: str, now: float) -> int | None: ...
    def touch(self, key: str, i: int, now: float) -> None: ...
    def insert(self, key: str, now: float, size: int) -> int: ...
    def copied_now(self, key: str, i: int, now: float, size: int) -> None: ...
    def get(self, key: str) -> Sender | None: ...
    def keys(self) -> list[str]: ...
    def add_listener(self, listener: Listener) -> None: ...
    async def observe(self, key: str, now: float, size: int, decide: Decide) -> Observation: ...
    async def refresh(self, key: str) -> Sender | None: ...
    async def annotate(self, key: str, *, adv: float | None = None, flags: int | None = None) -> bool: ...
    async def forget(self, key: str, expected: Sender) -> bool: ...
    async def start(self) -> None: ...
    async def close(self) -> None: ...


# ---------------------------------------------------------------- timing and naming


def resolution(settings: TopicConfig) -> float:
    """Precision of last-seen times shared between processes, and the advisor's step.

    A tenth of the shortest age that matters (advisory age, else the topic's age), within
    0.1 s .. 60 s: timeouts stay within 10% while a sender's last-seen time is written to the
    KV about once per advisory age instead of once per message.
    """
    age = float(settings.age or 0)
    adv = settings.advisory_age
    horizon = min(adv, age) if adv else age
    return min(max(horizon / 10, 0.1), 60.0)


def scan_interval(settings: TopicConfig) -> float:
    """How often stores scrub and flush and the advisor scans: half a resolution, at most 10 s."""
    return min(resolution(settings) / 2, 10.0)


def limiter_bucket(profile: Profile) -> str:
    """The KV bucket of a topic: named after the consumer every worker and pod shares."""
    return "SR_LIMITER_" + re.sub(r"[^A-Za-z0-9_-]", "_", profile.consumer_name)


_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_/-][A-Za-z0-9_/=-]*(\.[A-Za-z0-9_/=-]+)*$")


def encode_key(value: str) -> str:
    """A sender value as a KV key: readable when it is a valid key, else `=` + base64url."""
    if _PLAIN_KEY.match(value):
        return value
    raw = value.encode("utf-8", "surrogatepass")
    return "=" + base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_key(key: str) -> str:
    if not key.startswith("="):
        return key
    body = key[1:]
    return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode("utf-8", "surrogatepass")


def encode_sender(sender: Sender) -> bytes:
    return json.dumps(
        {
            "first": round(sender.first, 3),
            "seen": round(sender.seen, 3),
            "copied": round(sender.copied, 3),
            "size": sender.size,
            "adv": round(sender.adv, 3),
            "flags": sender.flags & _PERSISTED,
        },
        separators=(",", ":"),
    ).encode()


def decode_sender(data: bytes | None) -> Sender:
    """Raises ValueError (or KeyError/TypeError) for a value this version did not write."""
    doc = json.loads(data or b"")
    return Sender(
        first=float(doc["first"]),
        seen=float(doc["seen"]),
        copied=float(doc["copied"]),
        size=int(doc["size"]),
        adv=float(doc.get("adv", 0.0)),
        flags=int(doc.get("flags", 0)) & _PERSISTED,
    )


# ---------------------------------------------------------------- compact table


def size32(size: int) -> int:
    """A payload size as the table's unsigned 32-bit column holds it."""
    return max(0, min(size, 0xFFFFFFFF))


class SenderTable:
    """Senders as parallel columns; a dict maps each value to its row. Freed rows are reused."""

    def __init__(self, extra: Iterable[tuple[str, str]] = ()) -> None:
        self.index: dict[str, int] = {}
        self._free = array("q")
        self.first: array[float] = array("d")
        self.seen: array[float] = array("d")
        self.copied: array[float] = array("d")
        self.adv: array[float] = array("d")
        self.size: array[int] = array("I")
        self.flags: array[int] = array("B")
        self._columns: dict[str, array[Any]] = {
            "first": self.first,
            "seen": self.seen,
            "copied": self.copied,
            "adv": self.adv,
            "size": self.size,
            "flags": self.flags,
        }
        self._extra: list[array[Any]] = []
        for name, code in extra:
            self._columns[name] = array(code)
            self._extra.append(self._columns[name])

    def column(self, name: str) -> array[Any]:
        return self._columns[name]

    def __len__(self) -> int:
        return len(self.index)

    def __contains__(self, key: object) -> bool:
        return key in self.index

    def slot(self, key: str) -> int | None:
        return self.index.get(key)

    def sender_at(self, i: int) -> Sender:
        return Sender(self.first[i], self.seen[i], self.copied[i], self.size[i], self.adv[i], self.flags[i])

    def get(self, key: str) -> Sender | None:
        i = self.index.get(key)
        return None if i is None else self.sender_at(i)

    def set(self, i: int, s: Sender, *, keep_flags: int = 0) -> None:
        self.first[i] = s.first
        self.seen[i] = s.seen
        self.copied[i] = s.copied
        self.adv[i] = s.adv
        self.size[i] = size32(s.size)
        self.flags[i] = (s.flags & 0xFF & ~keep_flags) | (self.flags[i] & keep_flags)

    def put(self, key: str, s: Sender) -> int:
        """Insert or overwrite; extra columns of a new row start at 0."""
        i = self.index.get(key)
        if i is None:
            if self._free:
                i = self._free.pop()
                for col in self._columns.values():
                    col[i] = 0
            else:
                i = len(self.first)
                for col in self._columns.values():
                    col.append(0)
            self.index[key] = i
        self.set(i, s)
        return i

    def add(self, key: str, now: float, size: int) -> int:
        """A new sender first seen and copied `now`: `put` without building a Sender (hot path)."""
        if key in self.index or self._free:
            return self.put(key, Sender(first=now, seen=now, copied=now, size=size))
        i = len(self.first)
        self.first.append(now)
        self.seen.append(now)
        self.copied.append(now)
        self.adv.append(0.0)
        self.size.append(size32(size))
        self.flags.append(0)
        for col in self._extra:
            col.append(0)
        self.index[key] = i
        return i

    def remove(self, key: str) -> bool:
        i = self.index.pop(key, None)
        if i is None:
            return False
        self._free.append(i)
        return True

    def keys(self) -> list[str]:
        return list(self.index)

    def snapshot(self) -> dict[str, list[float | int]]:
        """Rows as `value: [first, seen, copied, size, adv, flags]`, the state file's layout."""
        f, s, c, z, a, g = self.first, self.seen, self.copied, self.size, self.adv, self.flags
        return {k: [f[i], s[i], c[i], z[i], a[i], g[i] & _PERSISTED] for k, i in self.index.items()}


# ---------------------------------------------------------------- memory store


class MemoryStore:
    """Senders of this process only. Scrubbed of senders not seen for `age` (twice that with
    advisories: there the active advisor forgets them at `age`, after announcing `expire`)."""

    kind = "memory"
    local = True

    def __init__(
        self,
        settings: TopicConfig,
        metrics: WorkerMetrics,
        *,
        clock: Callable[[], float] = time.time,
        table: SenderTable | None = None,
    ) -> None:
        if not settings.age:
            raise ValueError("a limiter state store needs the topic's age")
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self.age = float(settings.age)
        self.advisory_age = settings.advisory_age
        self.resolution = resolution(settings)
        self.interval = scan_interval(settings)
        self.keep_for = self.age * 2 if settings.advisory else self.age
        self.table = table if table is not None else SenderTable()
        # Read at scrape time: setting it on every new sender would cost more than the insert.
        metrics.limiter_seen.set_function(self.table.__len__)
        self._listeners: list[Listener] = []
        self._tasks: list[asyncio.Task[None]] = []

    # -- reading
    def __len__(self) -> int:
        return len(self.table)

    def get(self, key: str) -> Sender | None:
        return self.table.get(key)

    def keys(self) -> list[str]:
        return self.table.keys()

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def _notify(self, key: str) -> None:
        for listener in self._listeners:
            try:
                listener(key)
            except Exception:
                log.exception("state listener failed for %r", key)

    def _worth_a_look(self, s: Sender) -> bool:
        return bool(self._listeners) and (not s.announced or (s.adv > 0 and s.seen > s.adv))

    # -- life cycle
    async def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._maintain(), name=f"{self.kind}-store"))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def _maintain(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.scrub(self.clock())
            except Exception:
                log.exception("scrubbing the limiter state failed")

    async def scrub(self, now: float) -> int:
        """Forget senders not seen for `keep_for`; yields to the loop every few thousand."""
        removed = 0
        cutoff = now - self.keep_for
        t = self.table
        for n, key in enumerate(t.keys()):
            i = t.slot(key)
            if i is not None and t.seen[i] <= cutoff:
                t.remove(key)
                removed += 1
            if n % 5000 == 4999:
                await asyncio.sleep(0)
        return removed

    # -- the hot path
    def live_slot(self, key: str, now: float) -> int | None:
        """The sender's row if the limiter may decide on it from here, without waiting."""
        i = self.table.index.get(key)
        if i is None or now - self.table.seen[i] >= self.age:
            return None  # new, or forgotten: a new life
        return i

    def touch(self, key: str, i: int, now: float) -> None:
        """A message from a live sender."""
        t = self.table
        if now > t.seen[i]:
            t.seen[i] = now
        if t.adv[i] > 0 and self._listeners:
            self._notify(key)  # timed out before: the advisor owes a `recover`

    def insert(self, key: str, now: float, size: int) -> int:
        """A new sender (or a new life of a forgotten one), copied now: its row."""
        i = self.table.add(key, now, size)
        if self._listeners:
            self._notify(key)
        return i

    def copied_now(self, key: str, i: int, now: float, size: int) -> None:
        t = self.table
        t.copied[i] = now
        t.size[i] = size32(size)
        self.touch(key, i, now)

    async def observe(self, key: str, now: float, size: int, decide: Decide) -> Observation:
        """Record a message from `key` and apply `decide`; atomic per sender (no await inside)."""
        i = self.live_slot(key, now)
        if i is None:
            if not decide(None):
                return Observation(False, False)
            self.insert(key, now, size)
            return Observation(True, True)
        copy = decide(self.table.sender_at(i))
        if copy:
            self.copied_now(key, i, now, size)
        else:
            self.touch(key, i, now)
        return Observation(copy, False)

    # -- the advisor's side
    async def refresh(self, key: str) -> Sender | None:
        return self.table.get(key)

    async def annotate(self, key: str, *, adv: float | None = None, flags: int | None = None) -> bool:
        t = self.table
        i = t.slot(key)
        if i is None:
            return False
        if adv is not None:
            t.adv[i] = adv
        if flags is not None:
            t.flags[i] = (t.flags[i] & ~_PERSISTED) | (flags & _PERSISTED)
        return True

    async def forget(self, key: str, expected: Sender) -> bool:
        """Remove a sender unless it was seen again (or restarted) since `expected` was read."""
        current = self.table.get(key)
        if current is None:
            return True
        if current.seen != expected.seen or current.first != expected.first:
            return False
        self.table.remove(key)
        return True


# ---------------------------------------------------------------- file store


def load_state_file(path: Path) -> dict[str, Sender]:
    """Senders from a state file (raises OSError or ValueError when unreadable)."""
    doc = json.loads(path.read_text())
    if not isinstance(doc, dict) or doc.get("format") != FILE_FORMAT:
        raise ValueError(f"{path} is not a {FILE_FORMAT} file")
    if not isinstance(doc.get("senders"), dict):
        raise ValueError(f"{path} is not a {FILE_FORMAT} file")
    out: dict[str, Sender] = {}
    for key, row in doc["senders"].items():
        first, seen, copied, size, adv, flags = row
        out[key] = Sender(
            float(first), float(seen), float(copied), int(size), float(adv), int(flags) & _PERSISTED
        )
    return out


def _write_atomically(path: Path, data: dict[str, Any]) -> None:
    """Temp file in the same directory, fsync, rename: a crash leaves the old or the new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, separators=(",", ":"))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


class FileStore(MemoryStore):
    """The memory store, snapshotted to `path` every `save_interval` and on close."""

    kind = "file"

    def __init__(
        self,
        path: Path,
        settings: TopicConfig,
        metrics: WorkerMetrics,
        *,
        clock: Callable[[], float] = time.time,
        save_interval: float = SAVE_INTERVAL,
    ) -> None:
        super().__init__(settings, metrics, clock=clock)
        self.path = path
        self.save_interval = save_interval

    async def start(self) -> None:
        await self.load()
        await super().start()
        self._tasks.append(asyncio.create_task(self._saver(), name="file-store-saver"))

    async def load(self) -> None:
        if not self.path.exists():
            return
        try:
            senders = await asyncio.to_thread(load_state_file, self.path)
        except (OSError, ValueError, TypeError, KeyError) as err:
            log.error("limiter state %s unreadable, starting empty: %s", self.path, err)
            self.metrics.limiter_state_errors.inc()
            return
        now = self.clock()
        for key, sender in senders.items():
            if now - sender.seen < self.keep_for:
                self.table.put(key, sender)
        log.info("limiter state: loaded %d senders from %s", len(self.table), self.path)

    async def save(self) -> None:
        """Snapshot on the loop (consistent), serialise and write in a thread (no stall)."""
        data = {"format": FILE_FORMAT, "saved": self.clock(), "senders": self.table.snapshot()}
        try:
            await asyncio.to_thread(_write_atomically, self.path, data)
        except OSError as err:
            log.error("limiter state could not be saved to %s: %s", self.path, err)
            self.metrics.limiter_state_errors.inc()

    async def _saver(self) -> None:
        while True:
            await asyncio.sleep(self.save_interval)
            await self.save()

    async def close(self) -> None:
        await super().close()
        await self.save()


# ---------------------------------------------------------------- KV store


class _WrongRevision(Exception):
    """Someone else wrote the key since we read it: reload and decide again."""


async def ensure_bucket(js: JetStreamContext, bucket: str, *, ttl: float, description: str) -> api.StreamInfo:
    """Find or create a history-1 KV bucket. Three replicas when the cluster has room, else one."""
    stream = f"KV_{bucket}"
    try:
        info = await js.stream_info(stream)
    except nats.js.errors.NotFoundError:
        pass
    else:
        if info.config.max_age and info.config.max_age < ttl:
            log.warning("KV bucket %s keeps entries %ss, raising to %ss", bucket, info.config.max_age, ttl)
            info.config.max_age = ttl
            info = await js.update_stream(info.config)
        return info
    for replicas in (3, 1):
        try:
            await js.create_key_value(
                bucket=bucket, history=1, ttl=ttl, replicas=replicas, description=description
            )
            return await js.stream_info(stream)
        except nats.js.errors.APIError as err:
            if err.err_code == 10058:  # created concurrently by another process
                return await js.stream_info(stream)
            if replicas == 1 or err.err_code not in NO_ROOM_FOR_REPLICAS:
                raise
    raise AssertionError("unreachable")


class KVStore(MemoryStore):
    """A JetStream KV bucket shared by every process of the topic, behind a local cache."""

    kind = "kv"
    local = False

    def __init__(
        self,
        js: JetStreamContext,
        bucket: str,
        settings: TopicConfig,
        metrics: WorkerMetrics,
        *,
        clock: Callable[[], float] = time.time,
        op_timeout: float = KV_OP_TIMEOUT,
        load_timeout: float = 30.0,
    ) -> None:
        table = SenderTable(extra=(("rev", "Q"), ("kv_seen", "d")))
        super().__init__(settings, metrics, clock=clock, table=table)
        self.js = js
        self.bucket = bucket
        self.stream = f"KV_{bucket}"
        self.prefix = f"$KV.{bucket}."
        self.op_timeout = op_timeout
        self.load_timeout = load_timeout
        self.rev: array[int] = self.table.column("rev")
        self.kv_seen: array[float] = self.table.column("kv_seen")
        adv = settings.advisory_age
        horizon = min(adv, self.age) if adv else self.age
        # Seen refreshes only matter to the advisor: one is written just before the leader would
        # otherwise believe the sender silent for the advisory age, never once per message.
        self.refresh_seen = settings.advisory is not None
        self.refresh_after = max(horizon - self.resolution, self.resolution)
        self.bucket_ttl = self.age * 2
        self.degraded = True
        self._connected_once = False
        self._direct = False
        self._sub: Any = None
        self._last_seq = 0
        self._loaded = asyncio.Event()
        self._claims: dict[str, asyncio.Future[None]] = {}
        self._dirty: set[str] = set()
        self._urgent: set[str] = set()
        self._wake = asyncio.Event()

    # -- life cycle
    async def start(self) -> None:
        try:
            await self._connect()
        except Exception as err:
            self._fail(err, "KV state store unavailable at start")
        self._tasks.append(asyncio.create_task(self._maintain(), name="kv-store"))
        if not self.degraded:
            try:
                await asyncio.wait_for(self._loaded.wait(), self.load_timeout)
            except TimeoutError:
                log.warning("KV state %s still loading after %ss: continuing", self.bucket, self.load_timeout)

    async def _connect(self) -> None:
        await self._ensure_bucket()
        await self._watch(None)
        self._connected_once = True
        self.degraded = False

    async def _ensure_bucket(self) -> None:
        info = await asyncio.wait_for(
            ensure_bucket(
                self.js, self.bucket, ttl=self.bucket_ttl,
                description=f"stream-replicator limiter state of {self.settings.topic}",
            ),
            self.op_timeout * 3,
        )
        self._direct = bool(info.config.allow_direct)

    async def close(self) -> None:
        """Stop; write back decisions the KV has not seen (bounded: shutdown must not hang)."""
        await super().close()
        pending = self._dirty | self._urgent
        if pending and not self.degraded:
            try:
                await asyncio.wait_for(self._flush(sorted(pending)), 5.0)
            except Exception as err:
                log.warning("KV state: %d local decisions not written back on close: %s", len(pending), err)
        await self._unwatch()

    @property
    def loaded(self) -> bool:
        return self._loaded.is_set()

    # -- the watch: every process's writes reach every cache
    async def _watch(self, from_seq: int | None) -> None:
        await self._unwatch()
        if from_seq is None:
            self._loaded.clear()
            config = api.ConsumerConfig(deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT)
        else:
            config = api.ConsumerConfig(
                deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=from_seq
            )
        sub = await asyncio.wait_for(
            self.js.subscribe(
                self.prefix + ">",
                stream=self.stream,
                cb=self._on_watch,
                ordered_consumer=True,
                idle_heartbeat=2.0,
                inactive_threshold=60.0,
                config=config,
            ),
            self.op_timeout * 2,
        )
        self._sub = sub
        info = await asyncio.wait_for(sub.consumer_info(), self.op_timeout)
        if nothing_sent(info):
            self._loaded.set()

    async def _unwatch(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _on_watch(self, msg: Msg) -> None:
        try:
            meta = msg.metadata
            seq = meta.sequence.stream
            self._last_seq = max(self._last_seq, seq)
            key = decode_key(msg.subject[len(self.prefix) :])
            headers = msg.headers or {}
            if headers.get("KV-Operation") in _DELETE_OPS or "Nats-Marker-Reason" in headers:
                i = self.table.slot(key)
                if i is not None and seq > self.rev[i]:
                    self._drop(key)
            else:
                self._apply_remote(key, decode_sender(msg.data), seq)
            if meta.num_pending == 0:
                self._loaded.set()
        except (ValueError, KeyError, TypeError) as err:
            log.warning("ignoring a KV state entry on %s: %s", msg.subject, err)

    def _apply_remote(self, key: str, rec: Sender, rev: int) -> None:
        """Take a KV revision into the cache, keeping what only this process knows yet."""
        t = self.table
        i = t.slot(key)
        if i is None:
            i = t.put(key, rec)
            self.rev[i] = rev
            self.kv_seen[i] = rec.seen
            if self._loaded.is_set() and self._worth_a_look(rec):
                self._notify(key)
            return
        if rev <= self.rev[i]:
            return
        local_seen, local_copied, local_size = t.seen[i], t.copied[i], t.size[i]
        dirty = t.flags[i] & _DIRTY
        t.set(i, rec, keep_flags=_LOCAL_NEWER | _DIRTY)
        self.rev[i] = rev
        self.kv_seen[i] = rec.seen
        if local_seen > rec.seen:
            t.seen[i] = local_seen
        else:
            t.flags[i] &= ~_LOCAL_NEWER
        if dirty and local_copied > rec.copied:
            t.copied[i] = local_copied
            t.size[i] = local_size
        merged = t.sender_at(i)
        if self._loaded.is_set() and self._worth_a_look(merged):
            self._notify(key)

    def _drop(self, key: str) -> None:
        self.table.remove(key)
        self._dirty.discard(key)
        self._urgent.discard(key)

    def _cached(self, key: str) -> tuple[Sender | None, int]:
        i = self.table.slot(key)
        if i is None:
            return None, 0
        return self.table.sender_at(i), self.rev[i]

    def _tombstone(self, key: str, seq: int) -> tuple[Sender | None, int]:
        """The KV holds no live entry: drop ours, unless it is a decision still to be written."""
        i = self.table.slot(key)
        if i is None:
            return None, seq
        if self.table.flags[i] & _DIRTY:
            self.rev[i] = seq
            return self.table.sender_at(i), seq
        self._drop(key)
        return None, seq

    # -- KV operations: bounded in time; any failure but a wrong revision means "unavailable"
    def _check_connected(self) -> None:
        nc = getattr(self.js, "_nc", None)
        if nc is not None and not nc.is_connected:
            raise nats.errors.ConnectionClosedError

    async def _publish(self, key: str, data: bytes, headers: dict[str, str]) -> int:
        self._check_connected()
        try:
            ack = await asyncio.wait_for(
                self.js.publish(self.prefix + encode_key(key), data, headers=headers), self.op_timeout
            )
        except nats.js.errors.APIError as err:
            if err.err_code in _WRONG_LAST_SEQUENCE:
                raise _WrongRevision from err
            raise
        return int(ack.seq)

    async def _write(self, key: str, sender: Sender, last: int) -> int:
        return await self._publish(key, encode_sender(sender), {_EXPECT_LAST: str(last)})

    async def _fetch(self, key: str) -> tuple[Sender | None, int]:
        """The KV's current entry merged into the cache, and the revision to compare against."""
        self._check_connected()
        try:
            msg = await asyncio.wait_for(
                self.js.get_msg(self.stream, subject=self.prefix + encode_key(key), direct=self._direct),
                self.op_timeout,
            )
        except nats.js.errors.NotFoundError:
            return self._tombstone(key, 0)
        headers = msg.headers or {}
        seq = int(msg.seq or 0)
        if headers.get("KV-Operation") in _DELETE_OPS or "Nats-Marker-Reason" in headers:
            return self._tombstone(key, seq)
        self._apply_remote(key, decode_sender(msg.data), seq)
        return self._cached(key)

    def _fail(self, err: BaseException, what: str = "KV state store unavailable") -> None:
        self.metrics.limiter_state_errors.inc()
        if not self.degraded:
            log.warning(
                "%s (%s: %s): deciding from the local cache until it answers again",
                what, type(err).__name__, err,
            )
        self.degraded = True
        self._wake.set()

    # -- the hot path
    def live_slot(self, key: str, now: float) -> int | None:
        if key in self._claims:
            return None  # another worker here is claiming it: wait for its result in observe
        return super().live_slot(key, now)

    def touch(self, key: str, i: int, now: float) -> None:
        """A skipped message: only the cache changes (the KV hears of it later, if it must)."""
        t = self.table
        if now > t.seen[i]:
            t.seen[i] = now
            if self.refresh_seen and now > self.kv_seen[i]:
                t.flags[i] |= _LOCAL_NEWER
        if t.adv[i] > 0 and self.refresh_seen:
            self._urgent.add(key)  # the leader owes a `recover`: tell it now
            self._wake.set()
            self._notify(key)

    def _record_locally(self, key: str, current: Sender | None, now: float, size: int) -> None:
        """A copy decided without the KV: remembered here, written back when it answers."""
        if current is None:
            i = self.insert(key, now, size)
        else:
            i = self.table.put(key, replace(current, seen=max(current.seen, now), copied=now, size=size))
        self.table.flags[i] |= _DIRTY
        self._dirty.add(key)

    async def observe(self, key: str, now: float, size: int, decide: Decide) -> Observation:
        while (claim := self._claims.get(key)) is not None:
            await asyncio.shield(claim)  # another worker here is claiming this sender: use its result
        current, rev = self._cached(key)
        if current is not None and now - current.seen >= self.age:
            current = None
        if not decide(current):
            i = self.table.slot(key)
            if i is not None:
                self.touch(key, i, now)
            return Observation(False, False)
        if self.degraded:
            self.metrics.limiter_state_errors.inc()
            self._record_locally(key, current, now, size)
            return Observation(True, current is None)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._claims[key] = future
        try:
            return await self._claim(key, now, size, decide, rev)
        finally:
            del self._claims[key]
            future.set_result(None)

    async def _claim(self, key: str, now: float, size: int, decide: Decide, rev: int) -> Observation:
        """Compare-and-set the copy into the KV; a lost race re-decides on the winner's record."""
        current = self._cached(key)[0]
        for attempt in range(5):
            fresh = current is None or now - current.seen >= self.age
            if attempt and not decide(None if fresh else current):
                i = self.table.slot(key)
                if i is not None:
                    self.touch(key, i, now)
                return Observation(False, False)
            if fresh or current is None:
                record = Sender(first=now, seen=now, copied=now, size=size)
            else:
                record = replace(current, seen=max(current.seen, now), copied=now, size=size)
            try:
                new_rev = await self._write(key, record, rev)
            except _WrongRevision:
                try:
                    current, rev = await self._fetch(key)
                except Exception as err:
                    self._fail(err)
                    self._record_locally(key, None if fresh else current, now, size)
                    return Observation(True, fresh)
                continue
            except Exception as err:
                self._fail(err)
                self._record_locally(key, None if fresh else current, now, size)
                return Observation(True, fresh)
            self._written(key, record, new_rev)
            if fresh:
                self._notify(key)
            return Observation(True, fresh)
        log.warning("sender %r: KV contention did not settle in 5 tries: copying", key)
        self.metrics.limiter_state_errors.inc()
        return Observation(True, False)

    def _written(self, key: str, record: Sender, rev: int) -> None:
        """Our write landed as `rev`: the cache takes it, keeping any later local sighting."""
        t = self.table
        i = t.slot(key)
        local_seen = t.seen[i] if i is not None else 0.0
        i = t.put(key, record)
        flags = t.flags[i] & ~(_DIRTY | _LOCAL_NEWER)
        if local_seen > record.seen:
            t.seen[i] = local_seen
            if self.refresh_seen:
                flags |= _LOCAL_NEWER
        t.flags[i] = flags
        self.rev[i] = rev
        self.kv_seen[i] = record.seen
        self._dirty.discard(key)

    # -- write-backs: seen refreshes, advisory marks, decisions made while degraded
    async def _push(self, key: str, change: Callable[[Sender], Sender] | None = None) -> bool:
        """Write this process's view of `key` (changed by `change`) with compare-and-set."""
        for _ in range(5):
            current, rev = self._cached(key)
            if current is None:
                return False
            if change is None and not current.flags & (_DIRTY | _LOCAL_NEWER):
                return True  # nothing the KV does not know
            record = change(current) if change else current
            try:
                new_rev = await self._write(key, record, rev)
            except _WrongRevision:
                await self._fetch(key)
                continue
            self._written(key, record, new_rev)
            return True
        return False

    async def _flush(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 64):
            batch = keys[start : start + 64]
            results = await asyncio.gather(*(self._push(k) for k in batch), return_exceptions=True)
            for key, result in zip(batch, results, strict=True):
                if isinstance(result, BaseException):
                    self._fail(result)
                    return
                self._urgent.discard(key)

    async def _due_refreshes(self, now: float) -> list[str]:
        t = self.table
        due = []
        cutoff = now - self.refresh_after
        for n, key in enumerate(t.keys()):
            i = t.slot(key)
            if i is not None and t.flags[i] & _LOCAL_NEWER and self.kv_seen[i] <= cutoff:
                due.append(key)
            if n % 5000 == 4999:
                await asyncio.sleep(0)
        return due

    async def _maintain(self) -> None:
        last_scan = 0.0
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval)
            self._wake.clear()
            try:
                if self.degraded:
                    await self._recover()
                    if self.degraded:
                        await asyncio.sleep(min(1.0, self.interval * 4))
                    continue
                if self._urgent:
                    await self._flush(sorted(self._urgent))
                mono = time.monotonic()
                if mono - last_scan >= self.interval:
                    last_scan = mono
                    now = self.clock()
                    if self.refresh_seen:
                        await self._flush(await self._due_refreshes(now))
                    await self.scrub(now)
            except Exception:
                log.exception("KV state store maintenance failed")

    async def _recover(self) -> None:
        """Once the KV answers: resume the watch where it stopped, then write local decisions back."""
        try:
            if not self._connected_once:
                await self._connect()
            else:
                self._check_connected()
                try:
                    info = await asyncio.wait_for(self.js.stream_info(self.stream), self.op_timeout)
                    lost = info.state.last_seq < self._last_seq  # deleted and created again meanwhile
                except nats.js.errors.NotFoundError:
                    lost = True
                    log.warning("KV state bucket %s is gone: creating it again", self.bucket)
                    await self._ensure_bucket()
                if lost:
                    self._rewrite_all()
                    self._last_seq = 0
                    await self._watch(None)
                else:
                    await self._watch(self._last_seq + 1)
                self.degraded = False
        except Exception as err:
            log.debug("KV state store still unavailable: %s", err)
            return
        log.info(
            "KV state store %s is back: writing back %d local decisions", self.bucket, len(self._dirty)
        )
        await self._flush(sorted(self._dirty | self._urgent))

    def _rewrite_all(self) -> None:
        """The bucket lost its history: every cached sender is a decision to write back, against
        the new bucket's revisions (none yet)."""
        t = self.table
        for i in t.index.values():
            self.rev[i] = 0
            t.flags[i] |= _DIRTY
        self._dirty = set(t.index)

    async def scrub(self, now: float) -> int:
        removed = await super().scrub(now)
        if removed:
            self._dirty.intersection_update(self.table.index)
            self._urgent.intersection_update(self.table.index)
        return removed

    # -- the advisor's side
    async def refresh(self, key: str) -> Sender | None:
        if not self.degraded:
            try:
                return (await self._fetch(key))[0]
            except Exception as err:
                self._fail(err)
        return self.table.get(key)

    async def annotate(self, key: str, *, adv: float | None = None, flags: int | None = None) -> bool:
        def change(s: Sender) -> Sender:
            return replace(
                s,
                adv=s.adv if adv is None else adv,
                flags=s.flags if flags is None else (s.flags & ~_PERSISTED) | (flags & _PERSISTED),
            )

        if self.degraded:
            return False
        try:
            return await self._push(key, change)
        except Exception as err:
            self._fail(err)
            return False

    async def forget(self, key: str, expected: Sender) -> bool:
        current, rev = self._cached(key)
        if current is None:
            return True
        if self.degraded or current.seen != expected.seen or current.first != expected.first:
            return False
        try:
            await self._publish(key, b"", {"KV-Operation": "DEL", _EXPECT_LAST: str(rev)})
        except _WrongRevision:
            with contextlib.suppress(Exception):
                await self._fetch(key)
            return False
        except Exception as err:
            self._fail(err)
            return False
        self._drop(key)
        return True


async def read_kv_state(js: JetStreamContext, bucket: str, *, wait: float = 30.0) -> dict[str, Sender]:
    """Every sender in a topic's bucket (for the `state` command): one pass of an ordered consumer."""
    out: dict[str, Sender] = {}
    done = asyncio.Event()
    prefix = f"$KV.{bucket}."

    async def on_msg(msg: Msg) -> None:
        headers = msg.headers or {}
        key = decode_key(msg.subject[len(prefix) :])
        if headers.get("KV-Operation") in _DELETE_OPS or "Nats-Marker-Reason" in headers:
            out.pop(key, None)
        else:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                out[key] = decode_sender(msg.data)
        if msg.metadata.num_pending == 0:
            done.set()

    sub = await js.subscribe(
        prefix + ">",
        stream=f"KV_{bucket}",
        cb=on_msg,
        ordered_consumer=True,
        config=api.ConsumerConfig(deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT),
    )
    try:
        if not nothing_sent(await sub.consumer_info()):
            await asyncio.wait_for(done.wait(), wait)
    finally:
        await sub.unsubscribe()
    return out


async def open_store(
    profile: Profile,
    source_js: JetStreamContext,
    metrics: WorkerMetrics,
    *,
    clock: Callable[[], float] = time.time,
) -> StateStore:
    """The topic's store, started (file loaded, KV watched): one per process, shared by all workers."""
    settings = profile.settings
    store: MemoryStore
    if settings.limiter_state == "file":
        store = FileStore(profile.state_file(), settings, metrics, clock=clock)
    elif settings.limiter_state == "kv":
        store = KVStore(source_js, limiter_bucket(profile), settings, metrics, clock=clock)
    else:
        store = MemoryStore(settings, metrics, clock=clock)
    await store.start()
    return store
