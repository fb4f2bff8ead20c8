"""`make bench`: every benchmark in one run, each printing ratios against its same-run reference."""

from __future__ import annotations

import importlib
import sys

BENCHES = ("bench.dataplane", "bench.latency", "bench.memory", "bench.sampling", "bench.cold_start",
           "bench.limiter_memory", "bench.fleet_health", "bench.operator_reconcile", "bench.native_engine",
           "bench.blind_spots")


def main() -> int:
    failed = 0
    for name in BENCHES:
        print(f"\n=== {name} ===", flush=True)
        try:
            module = importlib.import_module(name)
        except ImportError as err:
            print(f"skipped: {err}")
            continue
        status = module.main([])
        failed += int(bool(status))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
