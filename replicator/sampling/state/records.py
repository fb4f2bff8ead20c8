"""A tracked sender, the store protocol, and how senders are named and encoded in files and KV."""

from __future__ import annotations

import base64
import re

import msgspec
import orjson

from replicator.config.model import Profile, TopicConfig

ANNOUNCED = 0x01
"""Persisted flag: the `new` advisory of this life of the sender went out."""
PERSISTED = 0x0F


# The compiled build type-checks without site-packages (setup.py): msgspec is unknown there.
class Sender(msgspec.Struct, frozen=True):  # type: ignore[call-arg, unused-ignore]
    """One tracked sender (a msgspec Struct: built ten times faster than a frozen dataclass, and
    a cold start builds several per sender). Times are unix seconds; `adv` is the last-seen time a `timeout`
    advisory was sent for (0: not timed out), so it doubles as that episode's identity. `src` is
    the source stream sequence of the message that claimed the last copy (0: unknown): a claim
    is made before the copy lands, so when that same message is delivered again (its copy never
    confirmed: a worker killed, a publish failed) it is copied again instead of skipped."""

    first: float
    seen: float
    copied: float
    size: int
    adv: float = 0.0
    flags: int = 0
    src: int = 0

    @property
    def announced(self) -> bool:
        return bool(self.flags & ANNOUNCED)


# ---------------------------------------------------------------- timing and naming


def resolution(settings: TopicConfig) -> float:
    """Precision of last-seen times shared between processes, and the advisor's step.

    A tenth of the shortest age that matters (advisory age, else the topic's age), within
    0.1 s .. 60 s: timeouts stay within 10% while a sender's last-seen time is written to the
    KV about once per advisory age instead of once per message.
    """
    age = float(settings.age or 0)
    adv = settings.advisory_age
    horizon = min(adv, age) if adv else age
    return min(max(horizon / 10, 0.1), 60.0)


def scan_interval(settings: TopicConfig) -> float:
    """How often stores scrub and flush and the advisor scans: half a resolution, at most 10 s."""
    return min(resolution(settings) / 2, 10.0)


def limiter_bucket(profile: Profile) -> str:
    """The KV bucket of a topic: named after what every worker and pod of it shares, the group
    (scaled) or the base name (ordered; the durable's name unless `durable` renames it, as a
    Go-format stream's `SR_<name>` does: its base name `SR_<name>_<stream>` keeps two streams
    with the same name apart)."""
    shared = profile.base_name if profile.settings.ordered else profile.consumer_name
    return "SR_LIMITER_" + re.sub(r"[^A-Za-z0-9_-]", "_", shared)


_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_/-][A-Za-z0-9_/=-]*(\.[A-Za-z0-9_/=-]+)*$")


def encode_key(value: str) -> str:
    """A sender value as a KV key: readable when it is a valid key, else `=` + base64url."""
    if _PLAIN_KEY.match(value):
        return value
    raw = value.encode("utf-8", "surrogatepass")
    return "=" + base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_key(key: str) -> str:
    if not key.startswith("="):
        return key
    body = key[1:]
    return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode("utf-8", "surrogatepass")


class _Record(msgspec.Struct):
    """A sender as the KV and the state file's readers see it: times to the millisecond."""

    first: float
    seen: float
    copied: float
    size: int
    adv: float
    flags: int
    src: int


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(Sender)  # straight into a Sender: a cold start reads one per claim and mark


def encode_sender(sender: Sender) -> bytes:
    return _ENCODER.encode(_Record(round(sender.first, 3), round(sender.seen, 3), round(sender.copied, 3),
                                   sender.size, round(sender.adv, 3), sender.flags & PERSISTED, sender.src))


def decode_sender(data: bytes | None) -> Sender:
    """Raises ValueError (or KeyError/TypeError) for a value this version did not write."""
    try:
        sender = _DECODER.decode(data or b"")
    except msgspec.ValidationError:  # a number written as text, a count as a float: read as before
        return _decode_leniently(data)
    if sender.flags & ~PERSISTED:
        return msgspec.structs.replace(sender, flags=sender.flags & PERSISTED)
    return sender


def _decode_leniently(data: bytes | None) -> Sender:
    doc = orjson.loads(data or b"")
    return Sender(
        first=float(doc["first"]),
        seen=float(doc["seen"]),
        copied=float(doc["copied"]),
        size=int(doc["size"]),
        adv=float(doc.get("adv", 0.0)),
        flags=int(doc.get("flags", 0)) & PERSISTED,
        src=int(doc.get("src", 0)),
    )


# ---------------------------------------------------------------- compact table


def size32(size: int) -> int:
    """A payload size as the table's unsigned 32-bit column holds it."""
    return max(0, min(size, 0xFFFFFFFF))
