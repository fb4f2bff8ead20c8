"""Heartbeats: periodic JetStream publishes that keep idle streams measurably alive (Go 0.8's feature)."""

from replicator.heartbeats.publisher import Heartbeats, heartbeat_profile

__all__ = ["Heartbeats", "heartbeat_profile"]
