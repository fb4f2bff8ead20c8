"""`limiter_state: file`: memory plus a JSON snapshot under `state_dir`, saved atomically."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from replicator.config.model import TopicConfig
from replicator.observe.metrics import WorkerMetrics
from replicator.sampling.state.memory import MemoryStore
from replicator.sampling.state.records import ANNOUNCED, PERSISTED, Sender

log = logging.getLogger(__name__)


FILE_FORMAT = "stream-replicator/v1/limiter_state"
SAVE_INTERVAL = 30.0


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
        first, seen, copied, size, adv, flags, *rest = row  # `src`, the 7th, came later
        src = int(rest[0]) if rest else 0
        out[key] = Sender(
            float(first), float(seen), float(copied), int(size), float(adv), int(flags) & PERSISTED, src
        )
    return out


def load_go_state_file(path: Path) -> dict[str, Sender]:
    """Senders from the Go Stream Replicator's state file (`{"Items": {value: {seen, copied, advised,
    size}}}`), so taking over from it does not forward the whole fleet again. Its senders were
    announced already; an `advised` one had its `timeout` advisory."""
    doc = json.loads(path.read_text())
    items = doc.get("Items") if isinstance(doc, dict) else None
    if not isinstance(items, dict):
        raise ValueError(f"{path} is neither a {FILE_FORMAT} file nor the Go tool's state file")
    out: dict[str, Sender] = {}
    for key, item in items.items():
        seen = _go_time(item.get("seen"))
        if not key or seen <= 0:
            continue
        out[key] = Sender(first=seen, seen=seen, copied=max(0.0, _go_time(item.get("copied"))),
                          size=int(float(item.get("size") or 0)), adv=seen if item.get("advised") else 0.0,
                          flags=ANNOUNCED)
    return out


def _go_time(value: object) -> float:
    """A Go time.Time in JSON (RFC 3339, nanoseconds) as unix seconds; the zero time is 0."""
    if not isinstance(value, str) or value.startswith("0001-01-01"):
        return 0.0
    return dt.datetime.fromisoformat(value).timestamp()


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
    except BaseException:  # whatever stopped the write: no half-written temporary file is left, then it propagates
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
            try:
                senders = await asyncio.to_thread(load_state_file, self.path)
            except ValueError:
                senders = await asyncio.to_thread(load_go_state_file, self.path)
                log.info("limiter state %s is the Go Stream Replicator's: imported", self.path)
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as err:
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
