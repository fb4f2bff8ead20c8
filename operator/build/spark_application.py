"""Pure builder: a StreamReplication's `spec.fleetHealth` -> a Kubeflow `ScheduledSparkApplication`.

The Spark operator then runs `replicator/fleet_health/app.py` on the schedule, one run at a time
(`Forbid`: runs are incremental and must not overlap). The job talks to the advisory cluster with that
cluster's own NATS credentials (or user and password) and TLS Secret, mounted into the driver and
every executor (each executor reads its share of the stream itself); the command line names only the
mounted files, so no secret reaches the Spark conf, the pods' command lines or the event log. An
`s3a://` output brings the Hadoop AWS connector of PySpark's own Hadoop version and its credentials
from a named Secret (env) or the pods' identity; other object stores need their connector in
`packages`. Owner references are the caller's business.
"""

from __future__ import annotations

import copy
import datetime as dt
import itertools
from collections.abc import Collection, Mapping
from typing import Any
from urllib.parse import urlsplit

from croniter import croniter
from replication_operator.build import pod_template
from replication_operator.model import images
from replication_operator.model.fleet_health import Driver, Executor, FleetHealth
from replication_operator.model.spec import Endpoint, ReplicationSpec, SpecError

from replicator.config.durations import parse_duration
from replicator.config.urls import url_userinfo

API_VERSION = "sparkoperator.k8s.io/v1beta2"
KIND = "ScheduledSparkApplication"
MAIN_APPLICATION_FILE = "local:///app/replicator/fleet_health/app.py"
DEFAULT_IMAGE = images.DEFAULT_SPARK_IMAGE
DEFAULT_SPARK_VERSION = "4.0.0"
DEFAULT_SCHEDULE = "@every 1h"
DEFAULT_BUCKET = "FLEET_HEALTH"
# Kubeflow's chart creates this account (with rights to start executor pods) in job namespaces.
DEFAULT_SERVICE_ACCOUNT = "spark-operator-spark"
CREDENTIALS_DIR = "/etc/stream-replicator/nats"
BASIC_AUTH_DIR = "/etc/stream-replicator/nats-basic-auth"
TLS_DIR = "/etc/stream-replicator/tls"
NKEY_DIR = "/etc/stream-replicator/nats-nkey"
TOKEN_DIR = "/etc/stream-replicator/nats-token"
CA_DIR = "/etc/stream-replicator/nats-ca"
TLS_FILES = (("ca.crt", "--tls-ca"), ("tls.crt", "--tls-cert"), ("tls.key", "--tls-key"))
# The Hadoop that PySpark (and so the Spark image) bundles: pyspark/jars/hadoop-client-api-<version>.jar.
# hadoop-aws must be exactly this version; a test keeps the two equal.
HADOOP_VERSION = "3.5.0"
HADOOP_AWS = f"org.apache.hadoop:hadoop-aws:{HADOOP_VERSION}"
# Output schemes whose file system is not in the image: the artifact that brings it, and an example.
CONNECTORS = {
    "gs": ("gcs-connector", "com.google.cloud.bigdataoss:gcs-connector:<version>"),
    "abfs": ("hadoop-azure", f"org.apache.hadoop:hadoop-azure:{HADOOP_VERSION}"),
    "abfss": ("hadoop-azure", f"org.apache.hadoop:hadoop-azure:{HADOOP_VERSION}"),
    "wasb": ("hadoop-azure", f"org.apache.hadoop:hadoop-azure:{HADOOP_VERSION}"),
    "wasbs": ("hadoop-azure", f"org.apache.hadoop:hadoop-azure:{HADOOP_VERSION}"),
}
BUILT_IN_SCHEMES = ("", "file", "hdfs", "viewfs")
# AWS SDK v2 providers (Hadoop 3.4+): the env vars from the Secret, or the pod's identity (web identity
# token / IRSA, container or instance profile) through the SDK's default chain.
S3_PROVIDER_ENV = "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider"
S3_PROVIDER_DEFAULT = "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider"
IVY_DIR = "/tmp/.ivy2"  # where spark-submit resolves `deps.packages`: the image's home is not writable
RUN_AS = 10001  # the Spark image's `replicator` user and group (Dockerfile)
HISTORY_LIMIT = 3

DRIVER_DEFAULTS: dict[str, Any] = {"cores": 1, "memory": "1g"}
EXECUTOR_DEFAULTS: dict[str, Any] = {"instances": 2, "cores": 1, "memory": "1g"}


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
    settings: Driver | Executor | None,
    defaults: Mapping[str, Any],
    labels: dict[str, str],
    secrets: list[dict[str, str]],
    env: list[dict[str, Any]],
) -> dict[str, Any]:
    pod_security, container_security = _security()
    chosen = settings.model_dump(exclude_none=True) if settings is not None else {}
    pod: dict[str, Any] = {
        **defaults,
        **{k: chosen[k] for k in defaults if k in chosen},
        "labels": dict(labels),
        "podSecurityContext": pod_security,
        "securityContext": container_security,
    }
    if secrets:
        pod["secrets"] = copy.deepcopy(secrets)
    if env:
        pod["env"] = copy.deepcopy(env)
    return pod


def _nats_files(
    cluster: Endpoint, tls_keys: Mapping[str, Collection[str]] | None
) -> tuple[list[str], list[dict[str, str]]]:
    """The job's NATS file arguments and the Secrets (name, mount path) that hold those files."""
    arguments: list[str] = []
    secrets: list[dict[str, str]] = []
    if cluster.credentials_secret:
        ref = cluster.credentials_secret
        arguments += ["--credentials", f"{CREDENTIALS_DIR}/{ref.key}"]
        secrets.append({"name": ref.name, "path": CREDENTIALS_DIR, "secretType": "Generic"})
    if cluster.basic_auth_secret:  # the whole Secret is mounted; the job reads the two keys at each connect
        basic = cluster.basic_auth_secret
        arguments += ["--user-file", f"{BASIC_AUTH_DIR}/{basic.username_key}",
                      "--password-file", f"{BASIC_AUTH_DIR}/{basic.password_key}"]
        secrets.append({"name": basic.name, "path": BASIC_AUTH_DIR, "secretType": "Generic"})
    if cluster.nkey_secret:
        arguments += ["--nkey-seed", f"{NKEY_DIR}/{cluster.nkey_secret.key}"]
        secrets.append({"name": cluster.nkey_secret.name, "path": NKEY_DIR, "secretType": "Generic"})
    if cluster.token_secret:  # the token stays out of the URL and the arguments: a file read at each connect
        arguments += ["--token-file", f"{TOKEN_DIR}/{cluster.token_secret.key}"]
        secrets.append({"name": cluster.token_secret.name, "path": TOKEN_DIR, "secretType": "Generic"})
    tls_secret = cluster.tls_secret
    if tls_secret:
        files = tuple(zip(cluster.tls_names, (flag for _, flag in TLS_FILES), strict=True))
        keys = (tls_keys or {}).get(tls_secret, cluster.tls_names)
        present = {k for k, _ in files if k in keys}
        _, cert, key_name = cluster.tls_names
        if cert not in present or key_name not in present:  # as the workers: a pair or nothing
            present -= {cert, key_name}
        arguments += ["--tls-scheme", "manual"]
        for key, flag in files:
            if key in present:
                arguments += [flag, f"{TLS_DIR}/{key}"]
        secrets.append({"name": tls_secret, "path": TLS_DIR, "secretType": "Generic"})
    if cluster.ca_config_map:  # trust-manager's bundle wins over the Secret's CA
        ref = cluster.ca_config_map
        if "--tls-ca" in arguments:
            index = arguments.index("--tls-ca")
            del arguments[index:index + 2]
        if "--tls-scheme" not in arguments:
            arguments += ["--tls-scheme", "manual"]
        arguments += ["--tls-ca", f"{CA_DIR}/{ref.key}"]
    return arguments, secrets


def _storage(fleet: FleetHealth) -> tuple[list[str], dict[str, str], list[dict[str, Any]]]:
    """Packages, Hadoop settings and env the output's file system needs; SpecError when it cannot work."""
    output = fleet.output
    packages = list(fleet.packages or [])
    scheme = urlsplit(output).scheme.lower() if "://" in output else ""
    hadoop: dict[str, str] = {}
    env: list[dict[str, Any]] = []
    if fleet.s3 and scheme != "s3a":
        raise SpecError(f"spec.fleetHealth.s3 is for an s3a:// output, not {output!r}")
    if scheme in ("s3", "s3n"):
        raise SpecError(f"spec.fleetHealth.output {output!r}: write s3a://, Hadoop's S3 file system")
    if scheme == "s3a":
        if not any(":hadoop-aws:" in p for p in packages):
            packages.append(HADOOP_AWS)
        ref = fleet.s3.credentials_secret if fleet.s3 else None
        if ref is not None:
            for key, variable in ((ref.access_key_id_key, "AWS_ACCESS_KEY_ID"),
                                  (ref.secret_access_key_key, "AWS_SECRET_ACCESS_KEY"),
                                  (ref.session_token_key, "AWS_SESSION_TOKEN")):
                if key:
                    env.append({"name": variable, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": key}}})
        hadoop["fs.s3a.aws.credentials.provider"] = S3_PROVIDER_ENV if env else S3_PROVIDER_DEFAULT
    elif scheme in CONNECTORS:
        artifact, example = CONNECTORS[scheme]
        if not any(f":{artifact}:" in p for p in packages):
            raise SpecError(
                f"spec.fleetHealth.output {output!r} needs the {scheme}:// file system connector, which the "
                f"Spark image lacks: declare it in spec.fleetHealth.packages (e.g. {example})"
            )
    elif scheme not in BUILT_IN_SCHEMES and not packages:
        raise SpecError(
            f"spec.fleetHealth.output {output!r}: no connector for {scheme}:// in the Spark image; "
            "declare it in spec.fleetHealth.packages"
        )
    return packages, hadoop, env


def _source_of_advisories(fleet: FleetHealth, spec: ReplicationSpec) -> list[str]:
    """`--stream` when named; otherwise the job finds the stream that stores the advisory subject."""
    if fleet.stream:
        return ["--stream", fleet.stream]
    if not spec.advisory:
        raise SpecError("spec.fleetHealth.stream is required when spec.advisory.subject is not set")
    return ["--subject", spec.advisory.subject]


def build_scheduled_spark_application(
    spec: ReplicationSpec, tls_keys: Mapping[str, Collection[str]] | None = None, image: str | None = None
) -> dict[str, Any]:
    """The `<name>-fleet-health` ScheduledSparkApplication for a StreamReplication with `spec.fleetHealth`;
    `tls_keys` maps a TLS Secret's name to the keys it holds (all three when unknown); `image`: the
    Spark image when the spec names none (default `DEFAULT_IMAGE`)."""
    fleet = spec.fleet_health
    if fleet is None:
        raise SpecError("spec.fleetHealth is not set")
    if not fleet.output:
        raise SpecError("spec.fleetHealth.output is required: where the Parquet tables go (path or s3a:// URI)")
    cluster = spec.endpoint(spec.advisory.cluster if spec.advisory else "target")
    url = fleet.url or cluster.url
    instances = (fleet.executor.instances if fleet.executor else None) or EXECUTOR_DEFAULTS["instances"]
    cores = (fleet.executor.cores if fleet.executor else None) or EXECUTOR_DEFAULTS["cores"]

    arguments = [
        "--url",
        url,
        *_source_of_advisories(fleet, spec),
        "--output",
        fleet.output,
        "--kv-bucket",
        fleet.kv_bucket or DEFAULT_BUCKET,
        # One stream slice per executor core: the read is the part that scales.
        "--partitions",
        str(instances * cores),
    ]
    nats_arguments, secrets = _nats_files(cluster, tls_keys)
    if (cluster.basic_auth_secret or cluster.token_secret) and url_userinfo(url):
        which = "basicAuthSecret" if cluster.basic_auth_secret else "tokenSecret"
        raise SpecError(f"spec.fleetHealth.url carries credentials and the advisory cluster has a {which}: "
                        "one way to authenticate (drop them from the URL)")
    arguments += nats_arguments
    packages, storage_hadoop, env = _storage(fleet)

    name = spec.resource_name
    labels = {
        "app.kubernetes.io/name": "stream-replicator",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": "fleet-health",
    }
    driver = _pod(fleet.driver, DRIVER_DEFAULTS, labels, secrets, env)
    driver["serviceAccount"] = fleet.service_account or DEFAULT_SERVICE_ACCOUNT
    executor = _pod(fleet.executor, EXECUTOR_DEFAULTS, labels, secrets, env)
    if cluster.ca_config_map:
        for spark_pod in (driver, executor):
            spark_pod["configMaps"] = [{"name": cluster.ca_config_map.name, "path": CA_DIR}]
    shape = fleet.template
    if shape is not None:
        for spark_pod in (driver, executor):
            pod_template.apply_spark(shape.pod, shape.container, spark_pod)

    template: dict[str, Any] = {
        "type": "Python",
        "pythonVersion": "3",
        "mode": "cluster",
        "image": fleet.image or image or DEFAULT_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "mainApplicationFile": MAIN_APPLICATION_FILE,
        "arguments": arguments,
        "sparkVersion": fleet.spark_version or DEFAULT_SPARK_VERSION,
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
    if shape is not None and (pull := pod_template.spark_pull_secrets(shape.pod)):
        template["imagePullSecrets"] = pull
    if packages:
        template["deps"] = {"packages": packages}
    spark_conf = {"spark.jars.ivy": IVY_DIR} if packages else {}
    spark_conf.update(fleet.spark_conf or {})
    hadoop_conf = {**storage_hadoop, **(fleet.hadoop_conf or {})}
    if spark_conf:
        template["sparkConf"] = spark_conf
    if hadoop_conf:  # the resource's own settings (fs.s3a.endpoint, ...) win
        template["hadoopConf"] = hadoop_conf

    app_spec: dict[str, Any] = {
        "schedule": fleet.schedule or DEFAULT_SCHEDULE,
        "suspend": fleet.suspend,
        "concurrencyPolicy": "Forbid",
        "successfulRunHistoryLimit": HISTORY_LIMIT,
        "failedRunHistoryLimit": HISTORY_LIMIT,
        "template": template,
    }
    if fleet.time_zone:
        app_spec["timeZone"] = fleet.time_zone
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": f"{name}-fleet-health",
            "namespace": spec.namespace,
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
