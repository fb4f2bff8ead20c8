"""`spec.native`: the native engine's form (a source entry or a mirror, engine/mirror.py) and how it
judges its own health (its Ready condition, and the
`StreamReplicatorNotReady` alert through it). NATS copies without pods, so readiness is read from
what the target stream and the source say about the entry (engine/health.py): no error, moving or
caught up lately, lag under a bound."""

from __future__ import annotations

from typing import Literal

from replication_operator.model.fields import Model, duration_field, field


class NativeSettings(Model):
    form: Literal["auto", "source", "mirror"] = field(
        "`mirror`: the target stream the resource creates is a mirror of the source (it keeps the source's "
        "sequence numbers and takes no other writer); `source`: a source entry on the target stream; `auto`: a "
        "mirror when the resource creates the target stream, else a source entry.", "auto")
    max_lag: int = field(
        "Ready only while the native engine's lag (messages on the source not yet on the target) is at most this.",
        100000, format="int64", minimum=0)
    max_inactive: str = duration_field(
        "Ready only while the native engine delivered a message, or had none waiting, within this long.", "1m")
