"""Sampling: find each message's sender and decide whether it goes upward now.

A sender is copied when it is new (never copied, or forgotten after `age` of silence), when its
last copy is older than `age` minus a per-sender splay, when the message carries a true
`update_flag`, or when its payload size moved by `size_trigger` since the last copy. A message
whose sender cannot be found is copied and counted: sampling must never lose data.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from replicator.config import TopicConfig
from replicator.limiter_state import Sender, StateStore
from replicator.metrics import WorkerMetrics

log = logging.getLogger(__name__)

SPLAY_FRACTION = 0.1
"""Up to this share of `age` is taken off each sender's interval, so a fleet that started in the
same minute does not come back in one spike every `age`; fixed per sender so it is fair."""

_TRUE_STRINGS = frozenset({"true", "yes", "1"})
_MISSING = object()


def key_spec(settings: TopicConfig) -> str:
    """How the key is found, as advisories and the CLI show it: `host.fqdn`, `header:X`, `token:3`."""
    if settings.inspect:
        return settings.inspect
    if settings.inspect_header:
        return f"header:{settings.inspect_header}"
    if settings.inspect_subject_token:
        return f"token:{settings.inspect_subject_token}"
    return ""


def splay(key: str, age: float) -> float:
    """Seconds taken off `age` for this sender: deterministic (crc32) so every process agrees."""
    return age * SPLAY_FRACTION * (zlib.crc32(key.encode("utf-8", "surrogatepass")) / 2**32)


def lookup(doc: Any, path: str) -> Any:
    """A dotted path into nested objects (list items by index); `_MISSING` when absent.

    A literal key containing dots wins over the nested reading, so `{"a.b": 1}` works too.
    """
    if isinstance(doc, dict) and path in doc:
        return doc[path]
    node = doc
    for part in path.split("."):
        if isinstance(node, dict):
            if part not in node:
                return _MISSING
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def _scalar_key(value: Any) -> str | None:
    """Only scalars identify a sender; objects, lists, null and "" do not."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value or None
    if isinstance(value, int | float):
        return orjson.dumps(value).decode()
    return None


def _header(headers: Mapping[str, str] | None, name: str) -> str | None:
    if not headers:
        return None
    value = headers.get(name)
    if value is None:
        lowered = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == lowered), None)
    return value or None


def is_true(value: Any) -> bool:
    """The update flag must say yes (JSON true, "true", "yes", "1"): being present is not enough."""
    if value is True:
        return True
    return isinstance(value, str) and value.strip().lower() in _TRUE_STRINGS


class _Payload:
    """Parses the JSON body once, on first need, for both the key and the update flag."""

    __slots__ = ("_doc", "_parsed", "_raw")

    def __init__(self, raw: bytes) -> None:
        self._raw = raw
        self._parsed = False
        self._doc: Any = _MISSING

    @property
    def doc(self) -> Any:
        """The decoded body, or `_MISSING` when it is not JSON (binary, truncated, too deep)."""
        if not self._parsed:
            self._parsed = True
            try:
                self._doc = orjson.loads(self._raw)
            except (ValueError, RecursionError):  # orjson.JSONDecodeError is a ValueError
                self._doc = _MISSING
        return self._doc


def _extract(
    settings: TopicConfig, subject: str, headers: Mapping[str, str] | None, body: _Payload
) -> str | None:
    if settings.inspect:
        doc = body.doc
        if not isinstance(doc, dict):
            return None
        return _scalar_key(lookup(doc, settings.inspect))
    if settings.inspect_header:
        return _header(headers, settings.inspect_header)
    if settings.inspect_subject_token:
        tokens = subject.split(".")
        n = settings.inspect_subject_token
        return (tokens[n - 1] or None) if n <= len(tokens) else None
    return None


def extract_key(
    settings: TopicConfig, subject: str, headers: Mapping[str, str] | None, payload: bytes
) -> str | None:
    """The sender identity of one message, or None when it has none (never raises)."""
    return _extract(settings, subject, headers, _Payload(payload))


def _flagged(settings: TopicConfig, headers: Mapping[str, str] | None, body: _Payload) -> bool:
    """`update_flag` read from the JSON body, or from a header of that name for non-JSON topics."""
    flag = settings.update_flag
    if not flag:
        return False
    doc = body.doc
    if isinstance(doc, dict) and is_true(lookup(doc, flag)):
        return True
    return is_true(_header(headers, flag))


class Limiter:
    """Decides per message whether to copy; tracks senders in a StateStore.

    One Limiter per worker (it carries that worker's metrics); the store is shared by all workers
    of a process, and with `limiter_state: kv` by every process of the topic.
    """

    def __init__(
        self,
        settings: TopicConfig,
        store: StateStore,
        metrics: WorkerMetrics,
        *,
        clock: Callable[[], float] = time.time,
        on_new: Callable[[str], None] | None = None,
    ) -> None:
        if not settings.sampling or not settings.age:
            raise ValueError("the limiter needs a sampling key (inspect, inspect_header, ...) and age")
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.clock = clock
        self.on_new = on_new
        self.age = float(settings.age)
        self.size_trigger = settings.size_trigger

    def decide(self, key: str, sender: Sender | None, now: float, size: int, forced: bool) -> bool:
        """The sampling rule for a sender the store knows (or None when new or forgotten)."""
        if sender is None or forced:
            return True
        if now - sender.copied >= self.age - splay(key, self.age):
            return True
        return bool(self.size_trigger) and abs(size - sender.size) >= (self.size_trigger or 0)

    async def should_copy(self, subject: str, headers: Mapping[str, str] | None, payload: bytes) -> bool:
        """True: copy it. False: skip it (the copier acks it on the source). Never raises for bad input."""
        body = _Payload(payload)
        try:
            key = _extract(self.settings, subject, headers, body)
        except Exception:  # a sampling bug must not stop replication
            log.exception("sampling key extraction failed on %s", subject)
            key = None
        if key is None:
            self.metrics.limiter_errors.inc()
            return True
        forced = _flagged(self.settings, headers, body)
        size = len(payload)
        now = self.clock()

        def decide(sender: Sender | None) -> bool:
            return self.decide(key, sender, now, size, forced)

        try:
            result = await self.store.observe(key, now, size, decide)
        except Exception:  # stores fail open themselves; this is the last line of defence
            log.exception("limiter state store failed for %r: copying", key)
            self.metrics.limiter_state_errors.inc()
            return True
        if result.new and self.on_new is not None:
            try:
                self.on_new(key)
            except Exception:
                log.exception("on_new callback failed for %r", key)
        if result.copy:
            self.metrics.limiter_passed.inc()
        else:
            self.metrics.limiter_skipped.inc()
        return result.copy
