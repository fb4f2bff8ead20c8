"""Limiter state stores: every tracked sender's first and last seen, last copy and advisory marks.

- `memory`: this process only; lost on restart.
- `file`: memory plus a JSON snapshot under `state_dir`, loaded on start and saved atomically
  every 30 s and on close, so a restart does not forward the whole fleet again.
- `kv`: a JetStream KV bucket on the source cluster, shared by every worker and process of the
  topic. Each process keeps a local cache fed by a KV watch, so deciding to *skip* costs no I/O.
  The KV is written only when a sender is copied (compare-and-set on the key's revision, so two
  processes never both forward one sender), and, with advisories on, when a sender's last-seen
  time would otherwise look older than the advisory age to the leader (at most once per sender
  per resolution interval, off the hot path). When the KV is unreachable the store fails open:
  it decides from its cache, copies what it cannot claim, counts `limiter_state_errors`, and
  writes its local decisions back once the KV answers again.

Senders live in parallel `array` columns indexed through one `dict[str, int]`: about 200 bytes
per sender at a million senders instead of ~600 for one Python object each.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from replicator.config.model import Profile
from replicator.observe.metrics import WorkerMetrics
from replicator.sampling.state.protocol import StateStore

if TYPE_CHECKING:  # the stores are imported by the topics that keep state (the package holds the limiter's types)
    from nats.js import JetStreamContext

    from replicator.sampling.state.memory import MemoryStore


async def open_store(
    profile: Profile,
    source_js: JetStreamContext,
    metrics: WorkerMetrics,
    *,
    clock: Callable[[], float] = time.time,
) -> StateStore:
    """The topic's store, started (file loaded, KV watched): one per process, shared by all workers."""
    from replicator.sampling.state.memory import MemoryStore

    settings = profile.settings
    store: MemoryStore
    if settings.limiter_state == "file":
        from replicator.sampling.state.file import FileStore

        store = FileStore(profile.state_file(), settings, metrics, clock=clock)
    elif settings.limiter_state == "kv":
        from replicator.sampling.state.kv import KVStore
        from replicator.sampling.state.records import limiter_bucket

        store = KVStore(source_js, limiter_bucket(profile), settings, metrics, clock=clock)
    else:
        store = MemoryStore(settings, metrics, clock=clock)
    await store.start()
    return store
