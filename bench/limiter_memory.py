"""Memory per tracked sender: `python -m bench.limiter_memory [senders]` (default 1,000,000).

Feeds one message per sender through a real Limiter on the memory store and measures, with
tracemalloc, everything the state keeps alive afterwards (sender strings included, because the
store holds them). The budget is 300 bytes per sender; the KV store's cache adds two columns.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time
import tracemalloc

from replicator.config import AdvisoryConfig, TopicConfig
from replicator.observe.metrics import Metrics
from replicator.sampling.limiter import Limiter
from replicator.sampling.state.kv import KVStore
from replicator.sampling.state.memory import MemoryStore
from replicator.sampling.state.records import Sender

BUDGET = 300


def _settings() -> TopicConfig:
    return TopicConfig(
        topic="fleet.registration",
        source_url="nats://127.0.0.1:4222",
        target_url="nats://127.0.0.1:4223",
        inspect_header="Sender",
        age=3600,
        advisory=AdvisoryConfig(target="fleet.advisories", age=1800),
    )


def _names(senders: int) -> list[str]:
    return [f"node-{n:07d}.dc1.example.net" for n in range(senders)]  # 30 chars, a typical FQDN


async def _memory_store(senders: int) -> tuple[float, float]:
    """Bytes per sender of the memory store, filled through a real Limiter; and its msgs/s."""
    settings = _settings()
    metrics = Metrics().worker("bench", "bench_0")
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    store = MemoryStore(settings, metrics)
    limiter = Limiter(settings, store, metrics, clock=lambda: 1_700_000_000.0)
    started = time.perf_counter()
    for name in _names(senders):
        await limiter.should_copy("fleet.registration", {"Sender": name}, b"{}")
    elapsed = time.perf_counter() - started
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(store) == senders
    return (after - before) / senders, senders / elapsed


def _kv_cache(senders: int) -> float:
    """Bytes per sender of the KV store's cache, filled the way its watch fills it (no server)."""
    settings = _settings()
    metrics = Metrics().worker("bench", "bench_0")
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    store = KVStore(None, "BENCH", settings, metrics)  # type: ignore[arg-type]  # never touches NATS here
    record = Sender(first=1_700_000_000.0, seen=1_700_000_000.0, copied=1_700_000_000.0, size=2048)
    for rev, name in enumerate(_names(senders), start=1):
        store._apply_remote(name, record, rev)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(store) == senders
    return (after - before) / senders


def measure(senders: int) -> dict[str, float]:
    memory, rate = asyncio.run(_memory_store(senders))
    kv = _kv_cache(senders)
    return {
        "senders": senders,
        "bytes_per_sender_memory_store": round(memory, 1),
        "bytes_per_sender_kv_cache": round(kv, 1),
        "budget": BUDGET,
        "limiter_msgs_per_second_under_tracemalloc": round(rate),
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    senders = int(args[0]) if args else 1_000_000
    result = measure(senders)
    print(json.dumps(result, indent=2))
    worst = max(result["bytes_per_sender_memory_store"], result["bytes_per_sender_kv_cache"])
    ok = worst <= BUDGET
    print(f"{'OK' if ok else 'OVER BUDGET'}: at most {worst} bytes per sender, budget {BUDGET}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
