"""Stopping asyncio tasks for good.

Python 3.11's `asyncio.wait_for`, which nats-py uses for every request (a JetStream publish, a KV
update), returns the result when a cancellation arrives in the same turn as the reply, and the
cancellation is lost. A task that loops (a heartbeat, a renewal, a scanner) then runs on, and a
plain `task.cancel(); await task` never returns: the process hangs on its way out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

RETRY_EVERY = 0.5  # seconds between cancellations of a task that swallowed one


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any]], retry_every: float = RETRY_EVERY) -> None:
    """Cancel `tasks` and return once every one has ended, cancelling again any that is still
    running `retry_every` later. The tasks' own outcomes (result, exception) are left on them."""
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=retry_every)
