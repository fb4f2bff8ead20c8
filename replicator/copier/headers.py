"""The header policy: what a copy does with every header nats-server interprets on publish.

A header the server interprets changes what a publish *does* (deduplicate, expire, purge, count,
schedule, join a batch). Copied as is, some would make the target refuse the copy for ever (a
batch that is never committed, a TTL on a stream without TTLs) and others would do something the
source never did (a second scheduler, another stream's retention). Each one therefore has a rule,
in one table (`RULES`), the same for ordered and scaled mode:

- `strip`: a condition of the original publish, already checked by the source; dropped.
- `rename`: kept as information under `Stream-Replicator-Orig-<name>`, without its effect.
- `honour`: kept with its effect when the target stream has the feature, else renamed.

The decision depends on the header *name* only (`decide`), plus two facts about the message (a
subject-delete marker is inert as a whole; a message that already crossed a replicator hop has a
replicator's `Nats-Msg-Id`). The copy path applies it to the raw header block (`apply_block`):
lines are dropped or renamed by name and every other byte is kept, so repeated names and padded
values survive exactly; `apply` is the same policy on a parsed dict. nats-server matches header
names case-sensitively, exactly up to the colon, and so does this table.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from replicator.copier.provenance import MSG_ID, PROVENANCE

RENAMED = "Stream-Replicator-Orig-"
_RENAMED: Final = RENAMED.encode()
_PROVENANCE: Final = PROVENANCE.encode()
_MSG_ID: Final = MSG_ID.encode()
MARKER = "Nats-Marker-Reason"
INCR = "Nats-Incr"


class Action(StrEnum):
    KEEP = "keep"
    STRIP = "strip"
    RENAME = "rename"
    HONOUR = "honour"


@dataclass(frozen=True)
class TargetFeatures:
    """The target stream's switches that decide whether an `honour` rule keeps its header (and
    whether ordered mode may write in fast-ingest batches, `batching.py`)."""

    ttl: bool = False  # allow_msg_ttl
    rollup: bool = False  # allow_rollup_hdrs and not deny_purge
    counter: bool = False  # allow_msg_counter
    batched: bool = False  # allow_batched (server 2.14+)

    @classmethod
    def of(cls, config: object) -> TargetFeatures:
        """From a nats-py `StreamConfig` (attributes a server without the feature leaves unset)."""
        return cls(
            ttl=bool(getattr(config, "allow_msg_ttl", False)),
            rollup=bool(getattr(config, "allow_rollup_hdrs", False)) and not getattr(config, "deny_purge", False),
            counter=bool(getattr(config, "allow_msg_counter", False)),
            batched=bool(getattr(config, "allow_batched", False)),
        )

    def has(self, feature: str | None) -> bool:
        return bool(feature) and bool(getattr(self, feature or "", False))


NO_FEATURES = TargetFeatures()


@dataclass(frozen=True)
class Rule:
    """`name` is exact, or a prefix when it ends with `*`."""

    name: str
    action: Action
    feature: str | None = None  # for HONOUR: the TargetFeatures switch
    mirror: str = ""  # what a native mirror / stream source does, for the manual's table
    why: str = ""


RULES: tuple[Rule, ...] = (
    Rule("Nats-Msg-Id", Action.RENAME, None,
         "mirror keeps it (no dedup); source keeps it and dedups on it",
         "the publisher's id is unique only within its own stream: the copy is deduplicated by the "
         "writer's own id instead; the publisher's id is kept renamed (dropped when it was a previous "
         "replicator hop's id)"),
    Rule("Nats-Expected-*", Action.STRIP, None, "mirror keeps them; source strips them",
         "conditions the source checked on the original publish; re-checked on another stream they "
         "fail for ever (ordered mode adds its own Nats-Expected-Last-Msg-Id)"),
    Rule("Nats-Batch-*", Action.STRIP, None, "mirror keeps them; source strips them",
         "the original atomic batch was committed on the source; republished one by one they would "
         "open a batch on the target that is never committed (10174, 10176)"),
    Rule("Nats-Required-Api-Level", Action.STRIP, None, "kept",
         "a condition on the server that took the original request, already met"),
    Rule("Nats-TTL", Action.HONOUR, "ttl", "kept; the target applies it when it allows TTLs",
         "the copy expires like the original where the target allows per-message TTLs (10166 otherwise)"),
    Rule("Nats-Rollup", Action.HONOUR, "rollup", "kept; applied when the target allows roll-ups",
         "a roll-up (KV purge, latest value) purges on the target where it allows roll-ups (10111 "
         "otherwise); on a target shared by many sources it purges their messages on that subject too"),
    Rule("Nats-Incr", Action.HONOUR, "counter", "mirror refuses counters; a source re-adds the increments",
         "on a counter stream the increment is re-applied (the payload, the source's total, is "
         "dropped and the target keeps its own), so many sources add up; elsewhere renamed, total kept"),
    Rule("Nats-Counter-Sources", Action.RENAME, None, "kept", "the source stream's own counter bookkeeping"),
    Rule("Nats-Marker-Reason", Action.RENAME, None, "kept",
         "a subject-delete marker records the *source's* retention at work; the target keeps its own, "
         "so the marker arrives inert: every server-interpreted header on it is renamed"),
    Rule("Nats-Schedule*", Action.RENAME, None, "mirror and sources refuse schedules (10186, 10187)",
         "the source runs the schedule and its output is copied too; honoured, the target would produce "
         "every scheduled message a second time (covers Nats-Scheduler, Nats-Schedule-Next)"),
    Rule("Nats-Stream-Source", Action.RENAME, None, "source replaces it with its own",
         "written by a native stream source; a plain publish with it is refused (10227); this copy's "
         "own provenance header takes its role"),
)


@dataclass(frozen=True)
class Decision:
    action: Action
    rule: Rule | None


_KEEP = Decision(Action.KEEP, None)
_EXACT = {r.name: r for r in RULES if not r.name.endswith("*")}
_PREFIXES = tuple((r.name[:-1], r) for r in RULES if r.name.endswith("*"))


def rule_for(name: str) -> Rule | None:
    rule = _EXACT.get(name)
    if rule is not None:
        return rule
    for prefix, r in _PREFIXES:
        if name.startswith(prefix):
            return r
    return None


def decide(name: str, features: TargetFeatures) -> Decision:
    """The action for one header name on a target with `features`."""
    if not name.startswith("Nats-"):
        return _KEEP
    rule = rule_for(name)
    if rule is None:
        return _KEEP
    if rule.action is Action.HONOUR:
        return Decision(Action.HONOUR if features.has(rule.feature) else Action.RENAME, rule)
    return Decision(rule.action, rule)


@dataclass(slots=True)
class Applied:
    """A source message's headers as the target gets them, and what that implies for the publish."""

    headers: dict[str, str]
    empty_payload: bool = False  # an honoured counter increment: the target computes the total
    chainable: bool = True  # False: must not carry Nats-Expected-* (the server refuses them with Nats-Incr)


class AppliedBlock:
    """A source message's header block after the policy, without its closing empty line, so this
    hop's own lines can be appended; and what that implies for the publish. (A plain class: see
    `window.Entry`.)"""

    __slots__ = ("chainable", "empty_payload", "head")

    def __init__(self, head: bytes, empty_payload: bool = False, chainable: bool = True) -> None:
        self.head = head
        self.empty_payload = empty_payload
        self.chainable = chainable


_NO_HEADERS: Final = AppliedBlock(b"NATS/1.0\r\n")  # shared: callers only read it


class HeaderPolicy:
    """`RULES` applied for one target stream's features."""

    def __init__(self, features: TargetFeatures = NO_FEATURES) -> None:
        self.features = features

    def apply(self, headers: dict[str, str] | None) -> Applied:
        """A new dict: the source's headers after the policy (this hop's own headers not yet added)."""
        if not headers:
            return Applied({})
        out = dict(headers)
        for name in out:
            if name.startswith("Nats-"):
                break
        else:
            return Applied(out)  # the common case: nothing the server interprets
        features = NO_FEATURES if MARKER in out else self.features
        hopped = PROVENANCE in out
        applied = Applied(out)
        for name in [n for n in out if n.startswith("Nats-")]:
            decision = decide(name, features)
            if decision.action is Action.KEEP:
                continue
            if decision.action is Action.HONOUR:
                if name == INCR:
                    applied.empty_payload, applied.chainable = True, False
                continue
            value = out.pop(name)
            if decision.action is Action.RENAME and not (name == MSG_ID and hopped):
                out.setdefault(RENAMED + name, value)  # an earlier hop's original wins
        return applied

    def apply_block(self, block: bytes | None) -> AppliedBlock:
        """The policy on a raw header block (`NATS/1.0\\r\\nName: value\\r\\n...\\r\\n`): lines the
        policy strips are dropped, renamed ones get the prefix, a previous hop's provenance goes
        (this hop adds its own); every other byte is kept."""
        if not block:
            return _NO_HEADERS
        head = block[:-2] if block.endswith(b"\r\n\r\n") else block.rstrip(b"\r\n") + b"\r\n"
        if b"\nNats-" not in head and b"\n" + _PROVENANCE not in head:
            return AppliedBlock(head)  # the common case: nothing the server interprets
        lines = head.split(b"\r\n")[:-1]
        names = [line[:line.find(b":")] if b":" in line else b"" for line in lines]
        features = NO_FEATURES if MARKER.encode() in names else self.features
        hopped = _PROVENANCE in names
        existing = set(names)
        applied = AppliedBlock(b"")
        out = [lines[0]]
        for line, name in zip(lines[1:], names[1:], strict=True):
            if name == _PROVENANCE:
                continue
            if not name.startswith(b"Nats-"):
                out.append(line)
                continue
            decision = decide(name.decode("latin-1"), features)
            if decision.action is Action.KEEP:
                out.append(line)
            elif decision.action is Action.HONOUR:
                out.append(line)
                if name == INCR.encode():
                    applied.empty_payload, applied.chainable = True, False
            elif decision.action is Action.RENAME:
                if not (name == _MSG_ID and hopped) and _RENAMED + name not in existing:
                    out.append(_RENAMED + line)  # an earlier hop's original wins
        applied.head = b"\r\n".join(out) + b"\r\n"
        return applied
