"""Pure builder: a StreamReplication's `spec.fleetHealth` -> a Kubeflow `ScheduledSparkApplication`.

The Spark operator then runs `replicator/fleet_health/app.py` on the schedule, one run at a time
(`Forbid`: runs are incremental and must not overlap). The job talks to the advisory cluster with that
cluster's own NATS credentials, mounted from its Secret into the driver and every executor, since
each executor reads its share of the stream itself. Owner references are the caller's business.
"""

from __future__ import annotations

import copy
import datetime as dt
import itertools
from collections.abc import Mapping
from typing import Any

from croniter import croniter
from replication_operator import images
from replication_operator.spec import SpecError

from replicator.config.durations import parse_duration

API_VERSION = "sparkoperator.k8s.io/v1beta2"
KIND = "ScheduledSparkApplication"
MAIN_APPLICATION_FILE = "local:///app/replicator/fleet_health/app.py"
DEFAULT_IMAGE = images.DEFAULT_SPARK_IMAGE
DEFAULT_SPARK_VERSION = "4.0.0"
DEFAULT_SCHEDULE = "@every 1h"
DEFAULT_BUCKET = "FLEET_HEALTH"
DEFAULT_CREDENTIALS_KEY = "user.creds"
# Kubeflow's chart creates this account (with rights to start executor pods) in job namespaces.
DEFAULT_SERVICE_ACCOUNT = "spark-operator-spark"
CREDENTIALS_DIR = "/etc/stream-replicator/nats"
RUN_AS = 10001  # the Spark image's `replicator` user and group (Dockerfile)
HISTORY_LIMIT = 3

DRIVER_DEFAULTS: dict[str, Any] = {"cores": 1, "memory": "1g"}
EXECUTOR_DEFAULTS: dict[str, Any] = {"instances": 2, "cores": 1, "memory": "1g"}


def _get(data: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or node.get(part) is None:
            return default
        node = node[part]
    return node


def _advisory_cluster(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    """The side (`target` by default) whose cluster holds the advisories."""
    side = _get(spec, "advisory.cluster", "target")
    if side not in ("source", "target"):
        raise SpecError(f"spec.advisory.cluster must be source or target, not {side!r}")
    return dict(spec.get(side) or {})


def _security() -> tuple[dict[str, Any], dict[str, Any]]:
    pod = {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    container = {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    return pod, container


def _pod(
    settings: Mapping[str, Any], defaults: Mapping[str, Any], labels: dict[str, str], secret: str | None
) -> dict[str, Any]:
    pod_security, container_security = _security()
    pod: dict[str, Any] = {
        **defaults,
        **{k: settings[k] for k in defaults if settings.get(k) is not None},
        "labels": dict(labels),
        "podSecurityContext": pod_security,
        "securityContext": container_security,
    }
    if secret:
        pod["secrets"] = [{"name": secret, "path": CREDENTIALS_DIR, "secretType": "Generic"}]
    return pod


def _source_of_advisories(fleet: Mapping[str, Any], spec: Mapping[str, Any]) -> list[str]:
    """`--stream` when named; otherwise the job finds the stream that stores the advisory subject."""
    if fleet.get("stream"):
        return ["--stream", str(fleet["stream"])]
    subject = _get(spec, "advisory.subject")
    if not subject:
        raise SpecError("spec.fleetHealth.stream is required when spec.advisory.subject is not set")
    return ["--subject", str(subject)]


def build_scheduled_spark_application(resource: Mapping[str, Any]) -> dict[str, Any]:
    """The `<name>-fleet-health` ScheduledSparkApplication for a StreamReplication with `spec.fleetHealth`."""
    meta = resource.get("metadata") or {}
    name = meta.get("name")
    if not name:
        raise SpecError("metadata.name is required")
    spec: Mapping[str, Any] = resource.get("spec") or {}
    fleet: Mapping[str, Any] = spec.get("fleetHealth") or {}
    if not fleet:
        raise SpecError("spec.fleetHealth is not set")
    output = fleet.get("output")
    if not output:
        raise SpecError("spec.fleetHealth.output is required: where the Parquet tables go (path or s3a:// URI)")

    cluster = _advisory_cluster(spec)
    url = fleet.get("url") or cluster.get("url")
    if not url:
        raise SpecError("spec.fleetHealth.url is required when the advisory cluster has no url")
    driver_settings: Mapping[str, Any] = fleet.get("driver") or {}
    executor_settings: Mapping[str, Any] = fleet.get("executor") or {}
    instances = int(executor_settings.get("instances") or EXECUTOR_DEFAULTS["instances"])
    cores = int(executor_settings.get("cores") or EXECUTOR_DEFAULTS["cores"])

    arguments = [
        "--url",
        str(url),
        *_source_of_advisories(fleet, spec),
        "--output",
        str(output),
        "--kv-bucket",
        str(fleet.get("kvBucket") or DEFAULT_BUCKET),
        # One stream slice per executor core: the read is the part that scales.
        "--partitions",
        str(instances * cores),
    ]
    secret_ref: Mapping[str, Any] = cluster.get("credentialsSecret") or {}
    secret = secret_ref.get("name")
    if secret:
        key = secret_ref.get("key") or DEFAULT_CREDENTIALS_KEY
        arguments += ["--credentials", f"{CREDENTIALS_DIR}/{key}"]

    app_name = f"{name}-fleet-health"
    labels = {
        "app.kubernetes.io/name": "stream-replicator",
        "app.kubernetes.io/instance": str(name),
        "app.kubernetes.io/component": "fleet-health",
    }
    driver = _pod(driver_settings, DRIVER_DEFAULTS, labels, secret)
    driver["serviceAccount"] = fleet.get("serviceAccount") or DEFAULT_SERVICE_ACCOUNT
    executor = _pod(executor_settings, EXECUTOR_DEFAULTS, labels, secret)

    template: dict[str, Any] = {
        "type": "Python",
        "pythonVersion": "3",
        "mode": "cluster",
        "image": fleet.get("image") or DEFAULT_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "mainApplicationFile": MAIN_APPLICATION_FILE,
        "arguments": arguments,
        "sparkVersion": str(fleet.get("sparkVersion") or DEFAULT_SPARK_VERSION),
        "restartPolicy": {
            "type": "OnFailure",
            "onFailureRetries": 2,
            "onFailureRetryInterval": 60,
            "onSubmissionFailureRetries": 2,
            "onSubmissionFailureRetryInterval": 60,
        },
        "driver": driver,
        "executor": executor,
    }
    for passthrough in ("sparkConf", "hadoopConf"):  # e.g. fs.s3a.* for an s3a:// output
        if fleet.get(passthrough):
            template[passthrough] = {str(k): str(v) for k, v in fleet[passthrough].items()}

    app_spec: dict[str, Any] = {
        "schedule": str(fleet.get("schedule") or DEFAULT_SCHEDULE),
        "suspend": bool(fleet.get("suspend", False)),
        "concurrencyPolicy": "Forbid",
        "successfulRunHistoryLimit": HISTORY_LIMIT,
        "failedRunHistoryLimit": HISTORY_LIMIT,
        "template": template,
    }
    if fleet.get("timeZone"):
        app_spec["timeZone"] = str(fleet["timeZone"])
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": app_name,
            "namespace": meta.get("namespace") or "default",
            "labels": copy.deepcopy(labels),
        },
        "spec": app_spec,
    }


def schedule_interval(schedule: str | None, now: dt.datetime | None = None, *, runs: int = 64) -> float | None:
    """The longest gap (seconds) between two scheduled runs, over the next `runs` runs: what "the
    job has not run for two intervals" means for an irregular cron (e.g. weekdays only). None when
    the schedule cannot be read (the Spark operator will say so on its object)."""
    text = (schedule or DEFAULT_SCHEDULE).strip()
    if text.startswith("@every "):
        try:
            return parse_duration(text.removeprefix("@every ").strip())
        except ValueError:
            return None
    if not croniter.is_valid(text):
        return None
    times = croniter(text, now or dt.datetime.now(dt.UTC))
    fires = [times.get_next(float) for _ in range(runs)]
    return max(b - a for a, b in itertools.pairwise(fires))
