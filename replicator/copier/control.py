"""Stop requests, wake-ups and backoff: the loops' cooperative scheduling, without a task per wait."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable


class Stopper:
    """A stop request that loops can both poll and await."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    @property
    def stopping(self) -> bool:
        return self.event.is_set()

    def stop(self) -> None:
        self.event.set()

    async def sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.event.wait(), seconds)


async def wait_wake(wake: asyncio.Event, timeout: float) -> None:
    """Wait for new messages or acks, at most `timeout`; cheaper than wait_for (no task per wait)."""
    if not wake.is_set():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await wake.wait()
    wake.clear()


class Backoff:
    def __init__(self, first: float = 0.1, cap: float = 5.0) -> None:
        self.first, self.cap, self.delay = first, cap, first

    def next(self) -> float:
        delay = self.delay
        self.delay = min(self.delay * 2, self.cap)
        return delay * (0.8 + random.random() * 0.4)

    def reset(self) -> None:
        self.delay = self.first


async def then(step: Awaitable[object], result: bool) -> bool:
    """`step`, then `result`: a decision that must wait for one step, as the awaitable a loop's
    synchronous fast path hands back."""
    await step
    return result
