"""`limiter_state: kv`: a JetStream KV bucket shared by every process of the topic.

Its cache and the watch that feeds it are `kv_cache.py`; here, the store's KV operations, the
claims of copies, and the write-backs. An operation that fails because the server, the bucket or
the way to them is unavailable (`transport.kv.UNREACHABLE`) degrades the store: it decides from
its cache and writes back when the KV answers again. Anything else is a bug and propagates.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import nats.errors
import nats.js.errors
import orjson
from msgspec.structs import replace

from replicator.config.model import TopicConfig
from replicator.observe.metrics import WorkerMetrics
from replicator.sampling.state.kv_bucket import DELETE_OPS, ensure_bucket
from replicator.sampling.state.kv_cache import DIRTY, LOCAL_NEWER, KVCache
from replicator.sampling.state.protocol import Decide, Observation
from replicator.sampling.state.records import PERSISTED, Sender, decode_sender, encode_key, encode_sender
from replicator.transport.grouped import GroupedPublisher
from replicator.transport.jetstream import PublishError
from replicator.transport.kv import EXPECT_LAST, UNREACHABLE, WRONG_LAST_SEQUENCE, unreachable

if TYPE_CHECKING:
    from nats.js import JetStreamContext

log = logging.getLogger(__name__)

KV_OP_TIMEOUT = 2.0
CAS_BLOCK = f"NATS/1.0\r\n{EXPECT_LAST}: %d\r\n\r\n".encode()
"""The compare-and-set header block (`header_block.encode`'s), its revision filled in with `%`."""
AHEAD_MAX = 4096  # claims started ahead of their message's turn (`claim_ahead`), done or not


class _WrongRevision(Exception):
    """Someone else wrote the key since we read it: reload and decide again."""


class KVStore(KVCache):
    """A JetStream KV bucket shared by every process of the topic, behind a local cache."""

    kind = "kv"
    local = False
    skips_from_table = False  # claims in progress and seen refreshes: every skip goes through `live_slot`, `touch`

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
        super().__init__(js, bucket, settings, metrics, clock=clock, op_timeout=op_timeout)
        self.load_timeout = load_timeout
        adv = settings.advisory_age
        horizon = min(adv, self.age) if adv else self.age
        # Seen refreshes only matter to the advisor: one is written just before the leader would
        # otherwise believe the sender silent for the advisory age, never once per message.
        self.refresh_after = max(horizon - self.resolution, self.resolution)
        self.bucket_ttl = self.age * 2
        self.degraded = True
        self._connected_once = False
        self._direct = False
        self._claims: dict[str, asyncio.Future[None]] = {}
        # Claims started ahead of their message's turn, by the message's source sequence: the
        # message's own `observe` takes the result instead of claiming again.
        self._ahead: dict[int, asyncio.Future[Observation]] = {}
        self._writes: GroupedPublisher | None = None

    # -- life cycle
    async def start(self) -> None:
        try:
            await self._connect()
        except UNREACHABLE as err:
            self._fail(err, "KV state store unavailable at start")
        self._tasks.append(asyncio.create_task(self._maintain(), name="kv-store"))
        if not self.degraded:
            try:
                await asyncio.wait_for(self._loaded.wait(), self.load_timeout)
            except TimeoutError:
                log.warning("KV state %s still loading after %ss: continuing", self.bucket, self.load_timeout)

    async def _connect(self) -> None:
        nc = getattr(self.js, "_nc", None)
        if self._writes is None and nc is not None:
            self._writes = GroupedPublisher(nc, self.op_timeout)
            await self._writes.start()
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
        try:
            if pending and not self.degraded:
                try:
                    await asyncio.wait_for(self._flush(sorted(pending)), 5.0)
                except UNREACHABLE as err:
                    log.warning("KV state: %d local decisions not written back on close: %s", len(pending), err)
        finally:  # a bug in the write-back is raised, once the watch and the writer are stopped
            await self._unwatch()
            for ahead in self._ahead.values():
                ahead.cancel()
            self._ahead.clear()
            if self._writes is not None:
                await self._writes.stop()

    # -- KV operations: bounded in time; `UNREACHABLE` means "unavailable", anything else is a bug
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
            if err.err_code in WRONG_LAST_SEQUENCE:
                raise _WrongRevision from err
            raise
        return int(ack.seq)

    async def _write(self, key: str, sender: Sender, last: int) -> int:
        """Compare-and-set `key` to `sender` if its revision is still `last`: written with every
        other write of this turn of the loop, each checked on its own (`GroupedPublisher`)."""
        if self._writes is None:
            return await self._publish(key, encode_sender(sender), {EXPECT_LAST: str(last)})
        self._check_connected()
        try:
            pub_ack = await self._writes.publish(self.prefix + encode_key(key), CAS_BLOCK % last, encode_sender(sender))
        except PublishError as err:
            if err.code in WRONG_LAST_SEQUENCE:
                raise _WrongRevision from err
            raise
        return int(orjson.loads(pub_ack)["seq"])

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
        if headers.get("KV-Operation") in DELETE_OPS or "Nats-Marker-Reason" in headers:
            return self._tombstone(key, seq)
        self._apply_remote(key, decode_sender(msg.data), seq)
        return self._cached(key)

    def _fail(self, err: BaseException, what: str = "KV state store unavailable") -> None:
        """Degrade on an outage (counted, logged once): decide from the cache until the KV answers.
        Anything else is a bug and is raised again, not taken for an outage."""
        if not unreachable(err):
            raise err
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

    def claim_ahead(self, key: str, now: float, size: int, decide: Decide, src: int) -> None:
        """Start deciding (and claiming) message `src` now, before its turn: a copy loop that meets
        a new sender looks at the deliveries behind it, so their claims travel together instead of
        a round trip each (`Limiter.claim_ahead`). Its `observe` then takes this result. Claims
        still go in the order of the messages, so a sender's first message is the one copied."""
        if not src or src in self._ahead or key in self._claims or self.degraded:
            return
        if len(self._ahead) >= AHEAD_MAX:
            for seq in [seq for seq, ahead in itertools.islice(self._ahead.items(), AHEAD_MAX // 4) if ahead.done()]:
                del self._ahead[seq]  # never taken: its message went to another worker or was not admitted
            if len(self._ahead) >= AHEAD_MAX:
                return
        self._ahead[src] = asyncio.ensure_future(self._observe(key, now, size, decide, src))

    def claiming_ahead(self, src: int) -> bool:
        return src in self._ahead

    async def observe(self, key: str, now: float, size: int, decide: Decide, src: int = 0) -> Observation:
        ahead = self._ahead.pop(src, None) if src else None
        if ahead is not None:
            return await ahead
        return await self._observe(key, now, size, decide, src)

    async def _observe(self, key: str, now: float, size: int, decide: Decide, src: int) -> Observation:
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
            self._record_locally(key, current, now, size, src)
            return Observation(True, current is None)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._claims[key] = future
        try:
            return await self._claim(key, now, size, decide, rev, src)
        finally:
            del self._claims[key]
            future.set_result(None)

    async def _claim(self, key: str, now: float, size: int, decide: Decide, rev: int, src: int) -> Observation:
        """Compare-and-set the copy, claimed by source sequence `src`, into the KV; a lost race
        re-decides on the winner's record."""
        current = self._cached(key)[0]
        for attempt in range(5):
            fresh = current is None or now - current.seen >= self.age
            if attempt and not decide(None if fresh else current):
                i = self.table.slot(key)
                if i is not None:
                    self.touch(key, i, now)
                return Observation(False, False)
            if fresh or current is None:
                record = Sender(first=now, seen=now, copied=now, size=size, src=src)
            else:
                record = replace(current, seen=max(current.seen, now), copied=now, size=size, src=src)
            try:
                new_rev = await self._write(key, record, rev)
            except _WrongRevision:
                try:
                    current, rev = await self._fetch(key)
                except UNREACHABLE as err:
                    self._fail(err)
                    self._record_locally(key, None if fresh else current, now, size, src)
                    return Observation(True, fresh)
                continue
            except UNREACHABLE as err:
                self._fail(err)
                self._record_locally(key, None if fresh else current, now, size, src)
                return Observation(True, fresh)
            self._written(key, record, new_rev)
            if fresh:
                self._notify(key)
            return Observation(True, fresh)
        log.warning("sender %r: KV contention did not settle in 5 tries: copying", key)
        self.metrics.limiter_state_errors.inc()
        return Observation(True, False)

    # -- write-backs: seen refreshes, advisory marks, decisions made while degraded
    async def _push(self, key: str, change: Callable[[Sender], Sender] | None = None) -> bool:
        """Write this process's view of `key` (changed by `change`) with compare-and-set."""
        for _ in range(5):
            current, rev = self._cached(key)
            if current is None:
                return False
            if change is None and not current.flags & (DIRTY | LOCAL_NEWER):
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
            if i is not None and t.flags[i] & LOCAL_NEWER and self.kv_seen[i] <= cutoff:
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
            except Exception:  # the store's only task outlives a bug in one pass (logged with its traceback)
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
        except UNREACHABLE as err:
            if not unreachable(err):
                raise
            log.debug("KV state store still unavailable: %s", err)
            return
        log.info(
            "KV state store %s is back: writing back %d local decisions", self.bucket, len(self._dirty)
        )
        await self._flush(sorted(self._dirty | self._urgent))

    # -- the advisor's side
    async def refresh(self, key: str) -> Sender | None:
        if not self.degraded:
            try:
                return (await self._fetch(key))[0]
            except UNREACHABLE as err:
                self._fail(err)
        return self.table.get(key)

    async def annotate(self, key: str, *, adv: float | None = None, flags: int | None = None) -> bool:
        def change(s: Sender) -> Sender:  # not `dataclasses.replace`: a mark per new sender, it costs
            return Sender(s.first, s.seen, s.copied, s.size, s.adv if adv is None else adv,
                          s.flags if flags is None else (s.flags & ~PERSISTED) | (flags & PERSISTED), s.src)

        if self.degraded:
            return False
        try:
            return await self._push(key, change)
        except UNREACHABLE as err:
            self._fail(err)
            return False

    async def forget(self, key: str, expected: Sender) -> bool:
        current, rev = self._cached(key)
        if current is None:
            return True
        if self.degraded or current.seen != expected.seen or current.first != expected.first:
            return False
        try:
            await self._publish(key, b"", {"KV-Operation": "DEL", EXPECT_LAST: str(rev)})
        except _WrongRevision:
            try:
                await self._fetch(key)
            except UNREACHABLE as err:
                self._fail(err)
            return False
        except UNREACHABLE as err:
            self._fail(err)
            return False
        self._drop(key)
        return True
