"""`spec.pool`: replications that run together in one pooled worker Deployment.

A pool is named per namespace. Its members share one Deployment (one `replicate --reload` process a
pod), one ConfigMap holding every member's profile and one metrics Service (build/pool.py). What a
pool cannot share is refused here, by the schema's CEL rules and, in the same words, by the model:
the native engine runs no pods, heartbeats are one per process (`name` is global in the worker's
config), and a NetworkPolicy is cut to one resource's NATS URLs.
"""

from __future__ import annotations

from typing import Any

POOL_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"  # a DNS label: it names the pool's objects
POOL_NAME_MAX = 50  # `<pool>-pool-metrics` stays a Service name (63 characters at most)
POOL_DESCRIPTION = (
    "Run in the namespace's shared worker pool of this name instead of a Deployment of its own: the pool's "
    "members share one Deployment (one process a pod, each replication its own profile), one ConfigMap and "
    "one metrics Service. Adding, changing or removing a member reloads the pool's profiles without "
    "restarting the others. Members must ask for the same pods (image, replicas, mode, service account, "
    "template, resources, Secrets, monitoring port); a mismatched member is refused (Ready False, reason "
    "PoolMismatch). Not with engine native, heartbeats or networkPolicy. docs/pools.md.")

_RULES: list[tuple[str, str, str]] = [  # (CEL rule, its message, the model's test as a CEL-free twin)
    ("!has(self.pool) || self.engine != 'native'",
     "pool needs the replicator engine (engine auto or replicator): the native engine runs no pods", "engine"),
    ("!has(self.pool) || !has(self.heartbeats)",
     "pool cannot publish heartbeats: they belong to a whole process; give heartbeats a resource of its own",
     "heartbeats"),
    ("!has(self.pool) || !has(self.networkPolicy) || !has(self.networkPolicy.enabled) || "
     "!self.networkPolicy.enabled",
     "pool cannot have networkPolicy.enabled: a pool's pods reach every member's NATS servers", "networkPolicy"),
]
POOL_RULES: list[dict[str, Any]] = [{"rule": rule, "message": message} for rule, message, _ in _RULES]


def pool_problems(pool: str | None, engine: str, heartbeats: bool, network_policy: bool) -> list[str]:
    """The CEL rules' messages that a spec breaks (for objects the API server never checked)."""
    if pool is None:
        return []
    broken = {"engine": engine == "native", "heartbeats": heartbeats, "networkPolicy": network_policy}
    return [message for _, message, key in _RULES if broken[key]]
