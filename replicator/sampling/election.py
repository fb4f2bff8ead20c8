"""Leader election: a JetStream KV lock with a TTL on the source cluster.

The leader holds one key in a bucket whose entries expire after `ttl`. Winning is `create` (it
fails while the key exists); holding is `update` with the last revision every ttl/3, so a leader
that lost the key to someone else notices at once. A leader that cannot renew steps down by
itself 0.75 x ttl after the last renewal it *sent*, while the server keeps the key until ttl after
it *stored* it: the old leader is always down before a standby can create the key, so two leaders
never copy at once. A standby campaigns every ttl/4, so after a crash (even kill -9) it takes over
within about ttl x 1.25 plus the server's expiry delay, well inside two TTLs.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING

import nats.js.errors

from replicator.config.model import Profile
from replicator.observe.gometrics import Sample
from replicator.observe.metrics import WorkerMetrics
from replicator.transport.errors import NATS_ERRORS
from replicator.transport.kv import EXPECT_LAST, WRONG_LAST_SEQUENCE, find_or_create_bucket
from replicator.transport.tasks import cancel_and_wait

if TYPE_CHECKING:
    from nats.js import JetStreamContext

log = logging.getLogger(__name__)

DEFAULT_TTL = 10.0
STEP_DOWN = 0.75
NOTIFY_TIMEOUT = 10.0  # seconds a stop waits for the on_change callbacks it set off

ChangeCallback = Callable[[bool], Awaitable[None] | None]


class ElectionError(RuntimeError):
    """The election bucket cannot be used as asked (e.g. it exists with another TTL)."""


def election_bucket(ttl: float) -> str:
    """`SR_ELECTION` for the default 10 s TTL; a bucket's max_age is its TTL, so other TTLs get
    their own bucket (`SR_ELECTION_2500MS`) rather than sharing one with the wrong expiry."""
    if ttl == DEFAULT_TTL:
        return "SR_ELECTION"
    return f"SR_ELECTION_{round(ttl * 1000)}MS"


def election_key(profile: Profile, role: str = "") -> str:
    """One key per topic, from the base name every pod of the topic shares (the durable's name,
    unless `durable` names it otherwise; for a Go-format stream `SR_<name>_<stream>`, the Go
    tool's own key, so both tools can share its bucket during a migration).

    `role` separates elections of one topic, e.g. "advisor" for advising in scaled mode while
    every worker copies.
    """
    name = re.sub(r"[^A-Za-z0-9_=-]", "_", profile.base_name)
    return f"{name}.{role}" if role else name


class LeaderElection:
    """Campaigns for one key; `is_leader` is true only while the lock is certainly held."""

    def __init__(
        self,
        js: JetStreamContext,
        bucket: str,
        key: str,
        identity: str,
        ttl: float,
        metrics: WorkerMetrics | None,
        *,
        op_timeout: float = 2.0,
        adopt_ttl: bool = False,
    ) -> None:
        if ttl < 1.0:
            raise ValueError("leader election ttl must be at least 1s")
        # A bucket someone else made (the Go tool's CHORIA_LEADER_ELECTION): use its TTL, not ours.
        self.adopt_ttl = adopt_ttl
        # Campaigns per state, as the Go-format metrics count them.
        self.campaigns = {"candidate": 0, "leader": 0}
        self.js = js
        self.bucket = bucket
        self.stream = f"KV_{bucket}"
        self.subject = f"$KV.{bucket}.{key}"
        self.key = key
        self.identity = identity
        self.ttl = ttl
        self.metrics = metrics
        self.op_timeout = op_timeout
        self.renew_every = ttl / 3
        self.campaign_every = ttl / 4
        self._leader = False
        self._rev = 0
        self._renewed_at = -math.inf
        self._callbacks: list[ChangeCallback] = []
        self._elected = asyncio.Event()
        self._deposed = asyncio.Event()
        self._deposed.set()
        self._task: asyncio.Task[None] | None = None
        self._notifier: asyncio.Task[None] | None = None
        if metrics is not None:
            metrics.leader.set(0)

    @property
    def is_leader(self) -> bool:
        """Also false once the step-down deadline passed, even before the loop noticed."""
        return self._leader and time.monotonic() < self._renewed_at + STEP_DOWN * self.ttl

    def on_change(self, cb: ChangeCallback) -> None:
        """`cb(True)` on gain, `cb(False)` on loss, in order, outside the renewal loop. Gate each
        copy on `is_leader` itself: it turns false at the step-down deadline without waiting."""
        self._callbacks.append(cb)

    async def wait_leader(self) -> None:
        """Returns once elected (at once when leading) and the on_change callbacks have run."""
        while not self.is_leader:
            await self._elected.wait()
            if not self.is_leader:
                await asyncio.sleep(0.05)
        if self._notifier is not None and not self._notifier.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(self._notifier)

    async def wait_lost(self) -> None:
        """Returns once leadership is lost (at once when not leading), at the latest by the
        step-down deadline even if the renewal loop is starved."""
        while self.is_leader:
            remaining = self._renewed_at + STEP_DOWN * self.ttl - time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._deposed.wait(), max(0.0, remaining) + 0.001)

    async def start(self) -> None:
        await self._ensure_bucket()
        self._task = asyncio.create_task(self._run(), name=f"election-{self.key}")

    async def stop(self, *, release: bool = True) -> None:
        """Stop campaigning. `release` deletes the key when we hold it, so a standby takes over at
        its next campaign instead of after the TTL; `release=False` behaves like a crash."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait([task])
            if not task.cancelled() and task.exception() is not None:
                log.error("election loop failed", exc_info=task.exception())
        if self._leader and release:
            try:
                await asyncio.wait_for(
                    self.js.publish(
                        self.subject, b"", headers={"KV-Operation": "DEL", EXPECT_LAST: str(self._rev)}
                    ),
                    self.op_timeout,
                )
            except NATS_ERRORS as err:  # it expires on its own after the TTL
                log.warning("could not release leadership of %s: %s", self.key, err)
        await self._set(False, "stopped")
        if self._notifier is not None:
            done, _ = await asyncio.wait([self._notifier], timeout=NOTIFY_TIMEOUT)
            if not done:
                log.warning("election %s: on_change callbacks still running after %.0f s: not waiting for them",
                            self.key, NOTIFY_TIMEOUT)

    async def _ensure_bucket(self) -> None:
        info, existed = await find_or_create_bucket(self.js, self.bucket, ttl=self.ttl,
                                                    description="stream-replicator leader election")
        max_age = info.config.max_age or 0.0
        if existed and self.adopt_ttl and max_age >= 1.0:
            self.ttl = max_age
            self.renew_every = max_age / 3
            self.campaign_every = max_age / 4
        elif existed and self.adopt_ttl:
            raise ElectionError(f"election bucket {self.bucket} must expire keys (a TTL of 1s or more)")
        if abs(max_age - self.ttl) > 0.001:
            raise ElectionError(
                f"election bucket {self.bucket} expires keys after {max_age}s, this election needs "
                f"{self.ttl}s (use election_bucket(ttl) for a bucket per TTL)"
            )

    async def _run(self) -> None:
        while True:
            if self._leader:
                await self._renew()
                wait = self.renew_every
                if self._leader:  # never sleep past the step-down deadline
                    wait = min(wait, max(0.0, self._renewed_at + STEP_DOWN * self.ttl - time.monotonic()))
            else:
                await self._campaign()
                wait = self.renew_every if self._leader else self.campaign_every
            await asyncio.sleep(wait)

    async def _put(self, last: int) -> int:
        ack = await asyncio.wait_for(
            self.js.publish(self.subject, self.identity.encode(), headers={EXPECT_LAST: str(last)}),
            self.op_timeout,
        )
        return int(ack.seq)

    def samples(self, identity: str, replicator: str) -> Iterable[Sample]:
        """Campaigns, leadership and interval, labelled as the Go tool labels its elections."""
        labels = {"election": self.key, "identity": identity, "replicator": replicator}
        for state, count in self.campaigns.items():
            yield "election_campaigns", {**labels, "state": state}, float(count)
        yield "election_leader", labels, 1.0 if self.is_leader else 0.0
        yield "election_interval_seconds", labels, self.interval

    @property
    def interval(self) -> float:
        """Seconds until the next campaign or renewal."""
        return self.renew_every if self._leader else self.campaign_every

    async def _campaign(self) -> None:
        self.campaigns["candidate"] += 1
        sent = time.monotonic()
        try:
            self._rev = await self._put(self._rev)
        except nats.js.errors.APIError as err:
            if err.err_code in WRONG_LAST_SEQUENCE:
                await self._learn_revision()
            return
        except NATS_ERRORS as err:
            log.debug("election %s: campaign failed: %s", self.key, err)
            return
        self._renewed_at = sent
        await self._set(True, "won the lock")

    async def _learn_revision(self) -> None:
        """Creating over a delete marker or an expired key needs that subject's last revision; a
        live key held by someone else means waiting (its revision changes with every renewal)."""
        try:
            msg = await asyncio.wait_for(
                self.js.get_msg(self.stream, subject=self.subject), self.op_timeout
            )
        except nats.js.errors.NotFoundError:
            self._rev = 0
            return
        except NATS_ERRORS:  # learnt at the next campaign
            return
        headers = msg.headers or {}
        deleted = headers.get("KV-Operation") in ("DEL", "PURGE") or "Nats-Marker-Reason" in headers
        self._rev = int(msg.seq or 0) if deleted else 0

    async def _renew(self) -> None:
        self.campaigns["leader"] += 1
        sent = time.monotonic()
        deadline = self._renewed_at + STEP_DOWN * self.ttl
        try:
            budget = max(0.01, min(self.op_timeout, deadline - sent))
            rev = await asyncio.wait_for(self._put(self._rev), budget)
        except nats.js.errors.APIError as err:
            if err.err_code in WRONG_LAST_SEQUENCE:
                self._rev = 0
                await self._set(False, "lost the lock to another candidate")
                return
            rev = 0
        except NATS_ERRORS as err:
            log.debug("election %s: renewal failed: %s", self.key, err)
            rev = 0
        if rev:
            self._rev = rev
            self._renewed_at = sent
        elif time.monotonic() >= deadline:
            await self._set(False, f"could not renew within {STEP_DOWN * self.ttl:.1f}s")

    async def _set(self, leader: bool, why: str) -> None:
        if leader == self._leader:
            return
        self._leader = leader
        if self.metrics is not None:
            self.metrics.leader.set(1 if leader else 0)
        if leader:
            self._elected.set()
            self._deposed.clear()
            log.info("election %s: %s is leader (%s)", self.key, self.identity, why)
        else:
            self._elected.clear()
            self._deposed.set()
            log.warning("election %s: %s stepped down (%s)", self.key, self.identity, why)
        # Callbacks run in order but off the renewal loop: a slow one must not cost the lock.
        self._notifier = asyncio.create_task(self._notify(self._notifier, leader))

    async def _notify(self, previous: asyncio.Task[None] | None, leader: bool) -> None:
        if previous is not None:
            with contextlib.suppress(BaseException):
                await previous
        for cb in list(self._callbacks):
            try:
                result = cb(leader)
                if inspect.isawaitable(result):
                    await result
            except Exception:  # a listener's bug (logged with its traceback) must not stop the election
                log.exception("election %s: on_change callback failed", self.key)

