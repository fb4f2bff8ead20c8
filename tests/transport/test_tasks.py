"""`cancel_and_wait` ends a task that swallowed its cancellation, as nats-py's requests can under
Python 3.11's `wait_for`, where a plain `cancel(); await` would wait for ever."""

from __future__ import annotations

import asyncio

import pytest

from replicator.transport.tasks import cancel_and_wait

pytestmark = pytest.mark.timeout(10)


async def swallows_first_cancellation() -> None:
    """A loop like a heartbeat's whose first cancellation is lost in a request that completed."""
    swallowed = False
    while True:
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            if swallowed:
                raise
            swallowed = True


async def test_a_task_that_swallowed_a_cancellation_is_cancelled_again() -> None:
    task = asyncio.ensure_future(swallows_first_cancellation())
    await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.sleep(0.3)
    assert not task.done(), "the first cancellation was lost: a plain `await task` would hang"
    await cancel_and_wait([task], retry_every=0.1)
    assert task.cancelled()


async def test_outcomes_stay_on_the_tasks() -> None:
    async def fails() -> None:
        raise ValueError("boom")

    finished = asyncio.ensure_future(asyncio.sleep(0))
    failed = asyncio.ensure_future(fails())
    await asyncio.sleep(0.01)
    running = asyncio.ensure_future(asyncio.sleep(60))
    await cancel_and_wait([finished, failed, running])
    assert finished.result() is None
    assert isinstance(failed.exception(), ValueError)
    assert running.cancelled()
