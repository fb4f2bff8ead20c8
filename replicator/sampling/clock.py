"""The stream's clock: silence is judged on the time of the messages read, not on the wall clock.

While the replicator reads a backlog (after an outage of the target, of the replicator, or a long
burst) the wall clock runs ahead of what it has seen: every sender whose messages are still unread
would look silent, and be advised `timeout` falsely, however honest its node. So the limiter and
the advisor read this clock. It is the wall clock while the replicator keeps up (its consumer has
nothing pending or unacknowledged); otherwise the time of the newest message the copy loops handed
to the limiter. A node that really stopped is still caught: its silence grows in stream time as the
backlog is read past it.

Where it fell behind by more than `slack` (from the newest message read while it kept up to the
moment it caught up again) it was not watching: a *blind spot*, handed to `on_blind_spot` once it
ends (`blind.py` publishes it as an advisory). Before it ends one, `before_catching_up` (the
advisor's scan) judges every silence the backlog revealed on the stream's time: a sender silent
past the age inside the blind spot is advised with a time inside it, whether the advisor's own scan
or this clock's poll came first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from nats.aio.client import Client
from nats.js.client import JetStreamContext

from replicator.transport.errors import NATS_ERRORS
from replicator.transport.tasks import cancel_and_wait

log = logging.getLogger(__name__)

POLL = 1.0  # seconds between reads of the consumer's pending counts


class StreamClock:
    """Wall time while caught up, else the newest message time read (see the module)."""

    def __init__(self, slack: float, *, since: float = 0.0, wall: Callable[[], float] = time.time) -> None:
        self.slack = slack
        self.wall = wall
        self.behind = True  # until the consumer says it has nothing pending
        self.known = False  # behind, and no message read yet: silence cannot be judged
        self.stream = 0.0  # time of the newest message read (unix s)
        self.blind_from = since or 0.0  # a blind spot under way began here (0: none); `since`: a restart's
        self.on_blind_spot: Callable[[float, float], None] | None = None
        self.before_catching_up: Callable[[], Awaitable[None]] | None = None
        self._task: asyncio.Task[None] | None = None

    def now(self) -> float:
        """What the limiter and the advisor call the present."""
        if not self.behind:
            return self.wall()
        return self.stream or self.wall()

    def judging(self) -> bool:
        """Silence may be judged (timeouts, expiry): caught up, or a message of the backlog read."""
        return not self.behind or self.known

    def observe_ns(self, ts_ns: int) -> None:
        """A copy loop handled a message stamped `ts_ns` (ns) by the source stream."""
        ts = ts_ns / 1e9
        if ts > self.stream:
            self.stream = ts
            self.known = True

    def pending(self, count: int) -> None:
        """The consumer holds `count` messages not yet read or not yet acknowledged. A blind spot
        begins when the newest message read falls more than `slack` behind the wall clock with
        messages pending, and ends when nothing is pending or the messages read are recent again."""
        wall = self.wall()
        self.behind = count > 0
        if self._still_blind(count, wall):
            if not self.blind_from:
                self.blind_from = self.stream  # the newest message read while it still kept up
            return
        if self.behind and not self.known:
            return  # a restart's backlog, not read yet: the blind spot (from `since`) goes on
        if self._long_blind(wall) and self.on_blind_spot is not None:
            self.on_blind_spot(self.blind_from, wall)
        self.blind_from = 0.0

    def _still_blind(self, count: int, wall: float) -> bool:
        return count > 0 and bool(self.stream) and wall - self.stream > self.slack

    def _long_blind(self, wall: float) -> bool:
        return bool(self.blind_from) and wall - self.blind_from > self.slack

    def _ends_blind_spot(self, count: int, wall: float) -> bool:
        """`pending(count)` would end a blind spot long enough to tell (its two early returns not taken)."""
        unread = count > 0 and not self.known
        return not self._still_blind(count, wall) and not unread and self._long_blind(wall)

    async def start(self, nc: Client, stream: str, consumer: str) -> None:
        self._task = asyncio.create_task(self._poll(nc, stream, consumer), name="stream-clock")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None

    async def _poll(self, nc: Client, stream: str, consumer: str) -> None:
        js = nc.jetstream(timeout=5)
        while True:
            with contextlib.suppress(*NATS_ERRORS):  # unreadable now: the clock keeps its last state
                count = await _pending_count(js, stream, consumer)
                if self.before_catching_up is not None and self._ends_blind_spot(count, self.wall()):
                    await self.before_catching_up()  # still on the stream's time (see the module)
                    count = await _pending_count(js, stream, consumer)
                self.pending(count)
            await asyncio.sleep(POLL)


async def _pending_count(js: JetStreamContext, stream: str, consumer: str) -> int:
    info = await js.consumer_info(stream, consumer)
    return (info.num_pending or 0) + (info.num_ack_pending or 0)
