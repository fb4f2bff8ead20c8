"""Sampling: find each message's sender and decide whether it goes upward now.

A sender is copied when it is new (never copied, or forgotten after `age` of silence), when its
last copy is older than `age` minus a per-sender splay, when the message carries a true
`update_flag`, or when its payload size moved by `size_trigger` since the last copy. A message
whose sender cannot be found is copied and counted: sampling must never lose data.
"""

from __future__ import annotations

import itertools
import logging
import time
import zlib
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from msgspec import MsgspecError

from replicator.config.model import TopicConfig
from replicator.observe.metrics import WorkerMetrics
from replicator.sampling.body import field_decoder
from replicator.sampling.keys import identifier, scalar_key, top_level_field, top_level_key_of
from replicator.sampling.state.protocol import StateStore
from replicator.sampling.state.records import Sender
from replicator.transport.header_block import encode as encode_headers
from replicator.transport.wire import ACK_STREAM_SEQ, ACK_TIMESTAMP, RawMsg, ack_tokens

log = logging.getLogger(__name__)


SPLAY_FRACTION = 0.1
"""Up to this share of `age` is taken off each sender's interval, so a fleet that started in the
same minute does not come back in one spike every `age`; fixed per sender so it is fair."""


def splay(key: str, age: float) -> float:
    """Seconds taken off `age` for this sender: deterministic (crc32) so every process agrees."""
    return age * SPLAY_FRACTION * (zlib.crc32(key.encode("utf-8", "surrogatepass")) / 2**32)


@dataclass(slots=True)
class Pending:
    """A decision only the store can make (a new sender, or one that may be due): see `settle`."""

    key: str
    now: float
    size: int
    forced: bool
    seq: int = 0


Check = Callable[[str, Mapping[str, str] | None, bytes, int], bool | Pending]
"""The decision for a message (subject, headers, payload) and its source stream sequence (0:
unknown), which the copy loops always give: a sender's claim by this very message is a copy that
never landed. (A type alias, not a Protocol: this module is compiled, and no compiled class may
derive from an interpreted one.)"""


DeliveryCheck = Callable[[RawMsg, list[str], int], bool | Pending]
"""`Check` for a delivery as the copy loops hold it: the message, its ack tokens, its stream sequence."""


def copy_everything(_msg: RawMsg, _tokens: list[str], _seq: int) -> bool | Pending:
    """The check of a topic that neither samples nor drops old messages: compiled, so asking it
    costs no interpreted call, and the ordered copier's runs do not ask it at all."""
    return True


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
        self.surely_not_due = self.age * (1 - SPLAY_FRACTION)  # no sender's interval is shorter
        self.identify = identifier(settings)
        # Headers are read only when the key or the flag may be in one; the copy loops then parse
        # the header block for it, else never.
        self.wants_headers = bool(settings.inspect_header or settings.update_flag)
        self.size_trigger = settings.size_trigger or 0
        # Counted here and added to the Prometheus counters by `flush` (once per batch in the copy
        # loops): a locked counter increment per message costs more than the skip it counts.
        self.unflushed_skipped = 0
        self.unflushed_passed = 0
        self.unflushed_skipped_bytes = 0
        self.unflushed_forced = 0
        # `check_general`, or its fusion with the table for a store whose table decides. The
        # decision when it needs no waiting, else what `settle` needs. At fleet rates most messages
        # come from a known sender that is not due: those are skipped here, synchronously, from the
        # store's cache; a store private to this process (memory, file) decides copies here too.
        # Only the shared KV store needs `settle` to claim a copy. Keyless messages are copied (and
        # counted).
        self.fused = self._table_check()
        self.ahead_last: RawMsg | None = None  # the last delivery `claim_ahead` looked at
        self.ahead_at = 0  # and its index in the deliveries then
        self.check: Check = self.check_general if self.fused is None else self._check_fused

    def _check_fused(self, subject: str, headers: Mapping[str, str] | None, payload: bytes,
                     seq: int = 0) -> bool | Pending:
        """`check` through the fused delivery check, for a message given by its parts."""
        assert self.fused is not None
        return self.fused(RawMsg(subject, "", encode_headers(headers) if self.wants_headers else None, payload),
                          [], seq)

    def for_deliveries(self) -> DeliveryCheck:
        """`check` for a delivery as the copy loops hold it (the ack subject's tokens unused):
        compiled here with the delivery's class, so no interpreted frame runs between the copy
        loop and the decision for every message."""
        if self.fused is not None:
            return self.fused
        check = self.check
        if self.wants_headers:
            return lambda msg, _tokens, seq: check(msg.subject, msg.headers, msg.data, seq)
        return lambda msg, _tokens, seq: check(msg.subject, None, msg.data, seq)

    def due(self, key: str, copied: float, last_size: int, now: float, size: int) -> bool:
        """The sampling rule for a known, live sender: its interval is over or its size moved."""
        since = now - copied
        if since >= self.surely_not_due and since >= self.age - splay(key, self.age):
            return True
        return bool(self.size_trigger) and abs(size - last_size) >= self.size_trigger

    def decide(self, key: str, sender: Sender | None, now: float, size: int, forced: bool, seq: int = 0) -> bool:
        """The rule for whatever the store holds (None: new or forgotten, always copied); message
        `seq` that claimed the sender's last copy comes again only because that copy never landed."""
        if sender is None or forced or (seq and sender.src == seq):
            return True
        return self.due(key, sender.copied, sender.size, now, size)

    def check_general(self, subject: str, headers: Mapping[str, str] | None, payload: bytes,
                      seq: int = 0) -> bool | Pending:
        """`check` for any setting and any store."""
        try:
            key, forced = self.identify(subject, headers, payload)
        except Exception:  # a sampling bug must not stop replication
            log.exception("sampling key extraction failed on %s", subject)
            key, forced = None, False
        return self.check_key(key, forced, len(payload), seq)

    def check_key(self, key: str | None, forced: bool, size: int, seq: int = 0) -> bool | Pending:
        """The decision for a message whose key (None: it has none) is known. A message that
        claimed its sender's last copy (`src`) is copied whenever it comes again: it is delivered
        again only because that copy was never confirmed."""
        if key is None:
            self.metrics.limiter_errors.inc()
            return True
        now = self.clock()
        if forced:
            self.unflushed_forced += 1
        store = self.store
        i = store.live_slot(key, now)
        if i is None:
            if not store.local:
                return Pending(key, now, size, forced, seq)
            return self._copy_new(key, now, size, seq)
        t = store.table
        copied = t.copied[i]
        # `due` is false without a call for the commonest message: copied recently, no size trigger.
        if forced or (seq and t.src[i] == seq) or ((now - copied >= self.surely_not_due or self.size_trigger)
                                                   and self.due(key, copied, t.size[i], now, size)):
            if not store.local:
                return Pending(key, now, size, forced, seq)
            store.copied_now(key, i, now, size, seq)
            self.unflushed_passed += 1
            return True
        store.touch(key, i, now)
        self.unflushed_skipped += 1
        self.unflushed_skipped_bytes += size
        return False

    def _copy_new(self, key: str, now: float, size: int, seq: int) -> bool:
        """A new sender (or a new life of a forgotten one) in a store private to this process:
        recorded and copied."""
        self.store.insert(key, now, size, seq)
        self.unflushed_passed += 1
        if self.on_new is not None:
            self._announce(key)
        return True

    def _table_check(self) -> DeliveryCheck | None:
        """The delivery check fused with the sender table, for a store whose table alone decides
        (memory, file) and no size trigger: a skipped message at fleet rates costs the key's
        extraction, one lookup and a few array reads, without the calls between them. The
        commonest key, a top-level JSON field, is read here too (`field_decoder`: the rest of the
        document is stepped over, not built); any other key, and the update flag, by `identify`.
        Anything else (a due or timed-out sender, a forced copy, a key that is not a string, no
        key) goes on to `check_key` with the key found. A sender missing from the table is new to
        a store whose table decides: added to the table straight away when no one listens for new
        senders (both compiled: the worst case, every sender new, then costs about a fifth less),
        else through the store's `insert`. The table's columns are never replaced, so they are
        bound once, here."""
        store = self.store
        if self.size_trigger or not store.skips_from_table:
            return None
        field = top_level_field(self.settings)
        decode = field_decoder(field) if field is not None else None
        top_field = field or ""
        identify, wants_headers = self.identify, self.wants_headers
        table = store.table
        index_get, seen, copied, adv, src = table.index.get, table.seen, table.copied, table.adv, table.src
        age, surely_not_due, clock, check_key = self.age, self.surely_not_due, self.clock, self.check_key
        copy_new, listeners = self._copy_new, store.listeners

        def check(msg: RawMsg, _tokens: list[str], seq: int) -> bool | Pending:
            payload = msg.data
            value: Any
            if decode is not None:
                try:
                    value = decode(payload).value
                except (MsgspecError, ValueError, RecursionError):  # no JSON object (`body.REFUSED`)
                    return check_key(top_level_key_of(payload, top_field), False, len(payload), seq)
                if type(value) is not str or not value:
                    return check_key(scalar_key(value), False, len(payload), seq)
            else:
                try:
                    value, forced = identify(msg.subject, msg.headers if wants_headers else None, payload)
                except Exception:  # a sampling bug must not stop replication
                    log.exception("sampling key extraction failed on %s", msg.subject)
                    value, forced = None, False
                if value is None or forced:
                    return check_key(value, forced, len(payload), seq)
            # The row and the clock's reading stay Python objects (`Any`): typed, the compiled code
            # would unbox them and box them again, an allocation, for each column read or write.
            i: Any = index_get(value)
            now = clock()
            if i is None:
                if listeners or self.on_new is not None:
                    return copy_new(value, now, len(payload), seq)
                table.add(value, now, len(payload), seq)  # a compiled call: no store between
                self.unflushed_passed += 1
                return True
            last: float = seen[i]
            last_copy: float = copied[i]
            advised: float = adv[i]
            claimed_by: int = src[i]
            if now - last < age and now - last_copy < surely_not_due and not advised and (claimed_by != seq or not seq):
                if now > last:
                    seen[i] = now
                self.unflushed_skipped += 1
                self.unflushed_skipped_bytes += len(payload)
                return False
            return check_key(value, False, len(payload), seq)

        return check

    def claim_ahead(self, deliveries: deque[RawMsg], most: int, oldest_ns: int = 0) -> None:
        """For a store that claims copies across processes (KV): start deciding the first `most`
        `deliveries` that will need the store (a new sender, or one due), in their order, while
        the copy loop waits for the delivery ahead of them. A cold start (every sender new) then
        pays a round trip to the KV per group of claims, not per sender. Nothing is counted or
        announced here: each delivery's own `settle` does that when its turn comes. Deliveries
        sent before `oldest_ns` (max_age: skipped unseen) are left alone. A call goes on from the
        last delivery the previous one looked at, while that is still waiting in `deliveries`."""
        store = self.store
        if store.local:
            return
        start = self._looked_ahead(deliveries)
        if start >= most // 2:
            return  # enough claims on their way: look again when half of them are taken
        now = self.clock()
        for msg in itertools.islice(deliveries, start, most):
            self.ahead_last = msg
            self.ahead_at = start
            start += 1
            reply = msg.reply
            if not reply:
                continue
            tokens = ack_tokens(reply)
            seq = int(tokens[ACK_STREAM_SEQ])
            if store.claiming_ahead(seq) or (oldest_ns and int(tokens[ACK_TIMESTAMP]) < oldest_ns):
                continue
            try:
                key, forced = self.identify(msg.subject, msg.headers if self.wants_headers else None, msg.data)
            except Exception:  # its own check logs it, in its turn
                continue
            if key is None:
                continue
            size = len(msg.data)
            i = store.live_slot(key, now)
            if i is not None and not forced and not (seq and store.table.src[i] == seq) and not self.due(
                    key, store.table.copied[i], store.table.size[i], now, size):
                continue  # a skip, decided at once in its turn
            store.claim_ahead(key, now, size, self._rule(key, now, size, forced, seq), seq)

    def _looked_ahead(self, deliveries: deque[RawMsg]) -> int:
        """How many deliveries at the front of `deliveries` the last `claim_ahead` looked at: where
        its last one is now, searched back from where it was (the copy loop takes from the front)."""
        last = self.ahead_last
        if last is None:
            return 0
        at = min(self.ahead_at, len(deliveries) - 1)
        while at >= 0 and deliveries[at] is not last:
            at -= 1
        if at < 0:  # taken already: look from the front again
            self.ahead_last = None
        self.ahead_at = max(at, 0)  # the next search starts where it is now
        return at + 1

    def _rule(self, key: str, now: float, size: int, forced: bool, seq: int) -> Callable[[Sender | None], bool]:
        def decide(sender: Sender | None) -> bool:
            return self.decide(key, sender, now, size, forced, seq)

        return decide

    async def settle(self, pending: Pending) -> bool:
        """Ask the store, which settles races between workers (and, on KV, between processes)."""
        key, now, size, forced, seq = pending.key, pending.now, pending.size, pending.forced, pending.seq
        try:
            result = await self.store.observe(key, now, size, self._rule(key, now, size, forced, seq), seq)
        except Exception:  # stores fail open themselves; this is the last line of defence
            log.exception("limiter state store failed for %r: copying", key)
            self.metrics.limiter_state_errors.inc()
            return True
        if result.new and self.on_new is not None:
            self._announce(key)
        if result.copy:
            self.unflushed_passed += 1
        else:
            self.unflushed_skipped += 1
            self.unflushed_skipped_bytes += size
        return result.copy

    def _announce(self, key: str) -> None:
        assert self.on_new is not None
        try:
            self.on_new(key)
        except Exception:  # the advisor's bug (logged with its traceback) must not stop replication
            log.exception("on_new callback failed for %r", key)

    def flush(self) -> None:
        """Add the decisions counted since the last flush to the metrics."""
        if self.unflushed_skipped:
            self.metrics.limiter_skipped.inc(self.unflushed_skipped)
            self.unflushed_skipped = 0
        if self.unflushed_passed:
            self.metrics.limiter_passed.inc(self.unflushed_passed)
            self.unflushed_passed = 0
        if self.unflushed_skipped_bytes:
            self.metrics.limiter_skipped_bytes.inc(self.unflushed_skipped_bytes)
            self.unflushed_skipped_bytes = 0
        if self.unflushed_forced:
            self.metrics.limiter_forced.inc(self.unflushed_forced)
            self.unflushed_forced = 0

    async def should_copy(self, subject: str, headers: Mapping[str, str] | None, payload: bytes,
                          seq: int = 0) -> bool:
        """True: copy it. False: skip it (the copier acks it on the source). Never raises for bad input."""
        verdict = self.check(subject, headers, payload, seq)
        if isinstance(verdict, Pending):
            verdict = await self.settle(verdict)
        self.flush()
        return verdict
