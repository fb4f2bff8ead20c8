"""A test stand-in (kubelet, watcher) that runs one loop in the background while it is open."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Self


class BackgroundLoop:
    """`async with` starts `_loop` as a task; `_halt` cancels it and waits for it to end, so a
    subclass's `__aexit__` halts the loop before it tears down what the loop was keeping."""

    _task: asyncio.Task[None] | None = None

    async def _loop(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._halt()

    async def _halt(self) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
