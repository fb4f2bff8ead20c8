"""The spark-submit application (what the ScheduledSparkApplication runs).

`spark-submit replicator/fleet_health/app.py --url ... --stream ... --output ...`: the master comes
from spark-submit (the Spark operator), so `--master` defaults to `submit` here.
"""

from __future__ import annotations

import argparse
import logging
import sys

from replicator.fleet_health.cli import add_arguments, run_from_args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="fleet-health", description="Aggregate advisories into fleet health.")
    add_arguments(parser)
    parser.set_defaults(master="submit")
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
