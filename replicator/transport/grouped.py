"""JetStream publishes made in one turn of the event loop, written together and settled as a group.

The limiter's KV claims are compare-and-set publishes, one per key. Awaited one by one, a fleet's
cold start (every sender new) paid a round trip to the server per sender. Here every publish
asked for while the loop runs one turn joins a group: the group goes out in one write (the raw
`Publisher.publish_many`, without nats-py's per-publish inbox, task and JSON), each answer
settles its own future as it comes, and one timer fails whatever the server has not answered
after `timeout`. Each publish keeps its own header, so a compare-and-set stays per key.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from nats.aio.client import Client

from replicator.transport.jetstream import Publisher, PublishError


class GroupedPublisher:
    """`publish` returns the PubAck's raw JSON (or raises `PublishError`, `TimeoutError`)."""

    def __init__(self, nc: Client, timeout: float) -> None:
        self.publisher = Publisher(nc, on_result=self._answered)
        self.timeout = timeout
        self._queue: list[tuple[tuple[str, bytes | None, bytes], asyncio.Future[bytes]]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        await self.publisher.start()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await self.publisher.stop()
        for _message, fut in self._queue:
            if not fut.done():
                fut.cancel()
        self._queue.clear()

    async def publish(self, subject: str, hdr: bytes | None, data: bytes) -> bytes:
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._queue.append(((subject, hdr, data), fut))
        if len(self._queue) == 1:  # the first of a group: the group goes once this turn has run
            task = asyncio.ensure_future(self._send())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await fut

    async def _send(self) -> None:
        group, self._queue = self._queue, []
        futures = [fut for _message, fut in group]
        try:
            tokens = await self.publisher.publish_many([message for message, _fut in group], futures)
        except BaseException:  # cancelled at a stop: nobody waits for ever
            for fut in futures:
                fut.cancel()
            raise
        asyncio.get_running_loop().call_later(self.timeout, self._expire, futures, tokens)

    def _answered(self, key: object, pub_ack: bytes, err: PublishError | None) -> None:
        fut = key
        assert isinstance(fut, asyncio.Future)
        if fut.done():
            return
        if err is not None:
            fut.set_exception(err)
        else:
            fut.set_result(pub_ack)

    def _expire(self, futures: Sequence[asyncio.Future[bytes]], tokens: Sequence[str]) -> None:
        for fut, token in zip(futures, tokens, strict=True):
            if not fut.done():
                self.publisher.drop(token)
                fut.set_exception(TimeoutError(f"no answer to a publish in {self.timeout:.0f} s"))
