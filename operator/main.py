"""`stream-replicator-operator`: run the operator (kopf) for some namespaces or the whole cluster.

Peering is on by default, so two replicas of the operator never act at once: the one with the
highest priority works and the others wait until its peering record expires. kopf pauses *all*
peers that share a priority, so each process draws a random one unless told. Peering needs kopf's
peering CRD and the named peering object (the Helm chart installs both); `--standalone` turns it off.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Sequence

import kopf
from replication_operator import handlers
from replication_operator.reconciler import OperatorConfig, Reconciler

DEFAULT_PEERING = "stream-replicator"
DEFAULT_LIVENESS = "http://0.0.0.0:8080/healthz"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stream-replicator-operator",
        description="Kubernetes operator for StreamReplication resources (streamreplicator.io/v1alpha1).",
        epilog="Environment: STREAM_REPLICATOR_WORKER_IMAGE, STREAM_REPLICATOR_SPARK_IMAGE, "
        "STREAM_REPLICATOR_STATUS_INTERVAL (s, default 30), STREAM_REPLICATOR_RESYNC_INTERVAL "
        "(s, default 300), STREAM_REPLICATOR_NATS_TIMEOUT (s, default 5).",
    )
    scope = parser.add_mutually_exclusive_group(required=True)
    scope.add_argument("-n", "--namespace", dest="namespaces", action="append", metavar="NAMESPACE",
                       help="serve this namespace (repeatable; globs like 'team-*' work)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="serve the whole cluster")
    parser.add_argument("--peering", default=DEFAULT_PEERING, metavar="NAME",
                        help=f"peering object shared by the operator's replicas (default {DEFAULT_PEERING})")
    parser.add_argument("--standalone", action="store_true",
                        help="no peering: only safe with exactly one operator replica")
    parser.add_argument("--priority", type=int, default=None,
                        help="peering priority: the highest acts, the others wait (default: random, so "
                        "that replicas differ; equal priorities would pause them all)")
    parser.add_argument("--liveness", default=DEFAULT_LIVENESS, metavar="URL",
                        help=f"liveness endpoint (default {DEFAULT_LIVENESS}); empty to disable")
    parser.add_argument("--log-format", choices=["plain", "full", "json"], default="full")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat[args.log_format.upper()])
    registry = kopf.get_default_registry()  # the "smart" registry: in-cluster and kubeconfig logins
    handlers.register(registry, Reconciler(OperatorConfig.from_env()))
    priority = args.priority if args.priority is not None else random.SystemRandom().randint(1, 10**9)
    kopf.run(
        registry=registry,
        standalone=args.standalone,
        peering_name=None if args.standalone else args.peering,
        priority=priority,
        clusterwide=args.all_namespaces,
        namespaces=args.namespaces or (),
        liveness_endpoint=args.liveness or None,
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
