"""`stream-replicator-operator`: run the operator (kopf) for some namespaces or the whole cluster.

Peering is on by default, so two replicas of the operator never act at once: the one with the
highest priority works and the others wait until its peering record expires. kopf pauses *all*
peers that share a priority, so each process draws a random one unless told. Peering needs kopf's
peering CRD and the named peering object (the Helm chart installs both); `--standalone` turns it off.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import random
import sys
from collections.abc import Mapping, Sequence

import kopf
from replication_operator import handlers
from replication_operator.reconcile.reconciler import Reconciler
from replication_operator.settings import POLICY_ENV, OperatorConfig, patterns

from replicator import add_version_argument

DEFAULT_PEERING = "stream-replicator"
DEFAULT_LIVENESS = "http://0.0.0.0:8080/healthz"
DEFAULT_METRICS_PORT = 8081


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stream-replicator-operator",
        description="Kubernetes operator for StreamReplication resources (streamreplicator.io/v1alpha1).",
        epilog="Environment: STREAM_REPLICATOR_WORKER_IMAGE, STREAM_REPLICATOR_SPARK_IMAGE, "
        "STREAM_REPLICATOR_STATUS_INTERVAL (s, default 30), STREAM_REPLICATOR_RESYNC_INTERVAL "
        "(s, default 300), STREAM_REPLICATOR_NATS_TIMEOUT (s, default 5), "
        "STREAM_REPLICATOR_CERTIFICATE_WARNING (duration, default 14d).",
    )
    add_version_argument(parser)
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
    parser.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT, metavar="PORT",
                        help=f"serve Prometheus /metrics on this port (default {DEFAULT_METRICS_PORT}); 0 to disable")
    parser.add_argument("--log-format", choices=["plain", "full", "json"], default="full")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--roles-only", action="store_true",
                        help="RBAC by Roles only: make no cluster-scoped API calls (exact --namespace "
                        "names; kopf does not follow namespace or CRD changes until restarted)")
    add_policy_arguments(parser)
    return parser


# flag -> (OperatorConfig field, what it allows)
POLICY_FLAGS = {
    "--allow-image": ("allowed_images", "an image resources may name (spec.image, spec.fleetHealth.image) "
                      "besides the operator's own worker and Spark images (default: none)"),
    "--allow-service-account": ("allowed_service_accounts", "a service account resources may name "
                                "(spec.serviceAccountName, spec.fleetHealth.serviceAccount), as NAME or "
                                "NAMESPACE/NAME (default: none; pods then run as the namespace's default)"),
    "--allow-unlabelled-secrets": ("unlabelled_secrets_namespaces", "a namespace whose Secrets resources may "
                                   "use without the label streamreplicator.io/usable=true (default: none)"),
    "--allow-nats-host": ("allowed_nats_hosts", "a NATS host resources may name in their URLs, or a CIDR "
                          "for IP addresses (default: *)"),
    "--allow-spark-conf": ("allowed_spark_conf", "a spec.fleetHealth.sparkConf key resources may set "
                           "(default: spark.hadoop.*)"),
    "--allow-spark-package": ("allowed_spark_packages", "a Maven package (group:artifact:version) resources "
                              "may load into the fleet-health job through spec.fleetHealth.packages "
                              "(default: the hadoop-aws, hadoop-azure and gcs-connector connectors)"),
    "--allow-priority-class": ("allowed_priority_classes", "a PriorityClass resources may give their pods "
                               "(spec.template.pod.priorityClassName); system-* classes only by a pattern "
                               "starting with system- (default: *)"),
    "--allow-privileged-pods": ("privileged_pods_namespaces", "a namespace whose resources' pod templates may "
                                "widen the pods (root, privileged, added capabilities, privilege escalation, "
                                "unconfined seccomp) (default: none)"),
}


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "tenancy policy",
        "What the author of a StreamReplication may choose; the operator refuses the rest (Degraded, "
        "nothing built). Glob patterns; each flag may be repeated and replaces its environment variable.",
    )
    env = dict(POLICY_ENV)
    for flag, (field, meaning) in POLICY_FLAGS.items():
        group.add_argument(flag, dest=field, action="append", metavar="PATTERN",
                           help=f"{meaning}; environment {env[field]} (comma-separated)")


def check_arguments(args: argparse.Namespace) -> str | None:
    """What is wrong with a combination of arguments, for `parser.error` (exit status 2)."""
    if args.roles_only:
        if args.all_namespaces:
            return "--roles-only needs --namespace: a cluster-wide operator needs a ClusterRole"
        globs = [ns for ns in args.namespaces or () if any(c in ns for c in "*?[!")]
        if globs:
            return f"--roles-only needs exact namespace names, not {', '.join(globs)}"
    return None


def operator_config(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> OperatorConfig:
    """The environment's settings, with the flags given on top."""
    config = OperatorConfig.from_env(env)
    flags = {
        field: tuple(p for value in getattr(args, field) for p in patterns(value))
        for field, _ in POLICY_FLAGS.values()
        if getattr(args, field) is not None
    }
    return dataclasses.replace(config, roles_only=args.roles_only, **flags)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    problem = check_arguments(args)
    if problem:
        parser.error(problem)
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat[args.log_format.upper()])
    registry = kopf.get_default_registry()  # the "smart" registry: in-cluster and kubeconfig logins
    reconciler = Reconciler(operator_config(args))
    logging.getLogger("replication_operator").info("tenancy policy: %s", reconciler.policy.summary())
    handlers.register(registry, reconciler, metrics_port=args.metrics_port or None)
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
