"""`spec.native`: how the native engine judges its own health (its Ready condition, and the
`StreamReplicatorNotReady` alert through it). NATS copies without pods, so readiness is read from
what the target stream and the source say about the entry (engine/health.py): no error, moving or
caught up lately, lag under a bound."""

from __future__ import annotations

from replication_operator.model.fields import Model, duration_field, field


class NativeSettings(Model):
    max_lag: int = field(
        "Ready only while the native engine's lag (messages on the source not yet on the target) is at most this.",
        100000, format="int64", minimum=0)
    max_inactive: str = duration_field(
        "Ready only while the native engine delivered a message, or had none waiting, within this long.", "1m")
