"""The fleet-health ScheduledSparkApplication builder against the real spark-operator CRD schema."""

from __future__ import annotations

import argparse
import copy
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from replication_operator.build.spark_application import (
    CREDENTIALS_DIR,
    HADOOP_AWS,
    HADOOP_VERSION,
    IVY_DIR,
    MAIN_APPLICATION_FILE,
    S3_PROVIDER_DEFAULT,
    S3_PROVIDER_ENV,
    TLS_DIR,
    build_scheduled_spark_application,
)
from replication_operator.model.spec import SpecError, parse_spec

from replicator.fleet_health.cli import add_arguments, connection_from_args
from tests.operator.helpers import SPARK_CRDS

BASE: dict[str, Any] = {
    "apiVersion": "streamreplicator.io/v1alpha1",
    "kind": "StreamReplication",
    "metadata": {"name": "registrations", "namespace": "replication"},
    "spec": {
        "topic": "choria.registration.>",
        "source": {"url": "nats://source.example.net:4222", "credentialsSecret": {"name": "source-nats"}},
        "target": {
            "url": "nats://central.example.net:4222",
            "credentialsSecret": {"name": "central-nats", "key": "replicator.creds"},
        },
        "advisory": {"subject": "replicator.advisories.registrations"},
        "fleetHealth": {
            "schedule": "*/15 * * * *",
            "stream": "REPLICATOR_ADVISORIES",
            "output": "s3a://fleet-health/registrations",
            "image": "registry.example.net/stream-replicator:0.1.0-spark",
            "sparkVersion": "4.0.0",
            "driver": {"cores": 1, "memory": "1g"},
            "executor": {"instances": 3, "cores": 2, "memory": "2g"},
            "kvBucket": "FLEET_HEALTH",
        },
    },
}


def resource(**fleet_changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(BASE)
    out["spec"]["fleetHealth"].update(fleet_changes)
    return out


def source_side() -> dict[str, Any]:
    out = resource(url=None)
    out["spec"]["advisory"]["cluster"] = "source"
    return out


def minimal() -> dict[str, Any]:
    out = copy.deepcopy(BASE)
    for side in ("source", "target"):
        del out["spec"][side]["credentialsSecret"]
    out["spec"]["fleetHealth"] = {"schedule": "@every 1h", "output": "/data/fleet-health"}
    return out


def secured(**fleet_changes: Any) -> dict[str, Any]:
    """TLS and credentials Secrets on the advisory cluster, S3 keys from a Secret."""
    out = resource(s3={"credentialsSecret": {"name": "fleet-s3"}}, **fleet_changes)
    out["spec"]["target"]["tlsSecret"] = "central-tls"
    return out


SPECS = {
    "target-credentials": resource(),
    "tls-creds-s3-secret": secured(),
    "s3a-pod-identity": resource(output="s3a://fleet/registrations"),
    "gcs-with-connector": resource(output="gs://fleet/registrations",
                                   packages=["com.google.cloud.bigdataoss:gcs-connector:hadoop3-2.2.26"]),
    "source-cluster": source_side(),
    "minimal-by-subject": minimal(),
    "suspended-s3a-conf": resource(
        suspend=True,
        url="tls://advisories.example.net:4222",
        timeZone="Europe/Amsterdam",
        hadoopConf={"fs.s3a.endpoint": "http://minio:9000", "fs.s3a.path.style.access": "true"},
        sparkConf={"spark.sql.shuffle.partitions": "16"},
    ),
}


@functools.cache
def spark_schema() -> dict[str, Any]:
    crd = yaml.safe_load((SPARK_CRDS / "sparkoperator.k8s.io_scheduledsparkapplications.yaml").read_text())
    (served,) = [v for v in crd["spec"]["versions"] if v.get("served")]
    return dict(served["schema"]["openAPIV3Schema"])


def pruned_fields(obj: Any, schema: dict[str, Any], path: str = "") -> Iterator[str]:
    """Fields a structural CRD would silently drop (jsonschema alone lets them through)."""
    if isinstance(obj, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, value in obj.items():
            if f"{path}.{key}" == ".metadata":
                continue  # ObjectMeta: the API server's, not the CRD's schema
            if props is not None and key in props:
                yield from pruned_fields(value, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                yield from pruned_fields(value, extra, f"{path}.{key}")
            elif not schema.get("x-kubernetes-preserve-unknown-fields") and extra is not True:
                yield f"{path}.{key}"
    elif isinstance(obj, list) and "items" in schema:
        for i, item in enumerate(obj):
            yield from pruned_fields(item, schema["items"], f"{path}[{i}]")


def job_args(app: dict[str, Any]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(app["spec"]["template"]["arguments"])


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_built_object_validates_against_the_spark_operator_crd(name: str) -> None:
    app = build_scheduled_spark_application(parse_spec(SPECS[name]))
    jsonschema.validate(app, spark_schema())
    assert list(pruned_fields(app, spark_schema())) == []
    spec = app["spec"]
    assert (app["apiVersion"], app["kind"]) == ("sparkoperator.k8s.io/v1beta2", "ScheduledSparkApplication")
    assert app["metadata"] == {
        "name": "registrations-fleet-health",
        "namespace": "replication",
        "labels": {
            "app.kubernetes.io/name": "stream-replicator",
            "app.kubernetes.io/instance": "registrations",
            "app.kubernetes.io/component": "fleet-health",
        },
    }
    assert spec["concurrencyPolicy"] == "Forbid"
    assert spec["successfulRunHistoryLimit"] >= 1 and spec["failedRunHistoryLimit"] >= 1
    template = spec["template"]
    assert (template["type"], template["mode"], template["pythonVersion"]) == ("Python", "cluster", "3")
    assert template["mainApplicationFile"] == MAIN_APPLICATION_FILE
    for role in ("driver", "executor"):
        pod = template[role]
        assert pod["podSecurityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["allowPrivilegeEscalation"] is False
        assert pod["securityContext"]["runAsUser"] != 0
    # The arguments are the job's own command line.
    args = job_args(app)
    assert args.kv_bucket == "FLEET_HEALTH"
    assert args.output == SPECS[name]["spec"]["fleetHealth"]["output"]


def test_credentials_of_the_advisory_cluster_are_mounted_and_passed() -> None:
    template = build_scheduled_spark_application(parse_spec(SPECS["target-credentials"]))["spec"]["template"]
    mount = [{"name": "central-nats", "path": CREDENTIALS_DIR, "secretType": "Generic"}]
    assert template["driver"]["secrets"] == mount and template["executor"]["secrets"] == mount
    args = job_args({"spec": {"template": template}})
    assert args.url == "nats://central.example.net:4222"
    assert args.credentials == f"{CREDENTIALS_DIR}/replicator.creds"
    assert (args.stream, args.partitions) == ("REPLICATOR_ADVISORIES", 6)  # 3 executors x 2 cores
    assert template["executor"]["instances"] == 3 and template["executor"]["memory"] == "2g"
    assert template["image"] == "registry.example.net/stream-replicator:0.1.0-spark"

    source = build_scheduled_spark_application(parse_spec(SPECS["source-cluster"]))["spec"]["template"]
    assert source["driver"]["secrets"][0]["name"] == "source-nats"
    args = job_args({"spec": {"template": source}})
    assert args.url == "nats://source.example.net:4222"
    assert args.credentials == f"{CREDENTIALS_DIR}/user.creds"  # the CRD's default key


def test_minimal_spec_uses_defaults_and_finds_the_stream_by_subject() -> None:
    app = build_scheduled_spark_application(parse_spec(SPECS["minimal-by-subject"]))
    template = app["spec"]["template"]
    assert "secrets" not in template["driver"] and "secrets" not in template["executor"]
    args = job_args(app)
    assert (args.stream, args.subject) == (None, "replicator.advisories.registrations")
    assert args.credentials is None and args.partitions == 2
    assert app["spec"]["schedule"] == "@every 1h" and app["spec"]["suspend"] is False


def test_overrides_pass_through() -> None:
    app = build_scheduled_spark_application(parse_spec(SPECS["suspended-s3a-conf"]))
    assert app["spec"]["suspend"] is True and app["spec"]["timeZone"] == "Europe/Amsterdam"
    template = app["spec"]["template"]
    assert template["hadoopConf"]["fs.s3a.path.style.access"] == "true"
    assert template["sparkConf"] == {"spark.sql.shuffle.partitions": "16", "spark.jars.ivy": IVY_DIR}
    assert job_args(app).url == "tls://advisories.example.net:4222"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"output": None}, "output"),
        ({"stream": None}, "stream"),
    ],
)
def test_unusable_specs_are_refused(change: dict[str, Any], message: str) -> None:
    broken = resource(**change)
    if "stream" in change:
        del broken["spec"]["advisory"]
    with pytest.raises(SpecError, match=message):
        build_scheduled_spark_application(parse_spec(broken))


def test_tls_and_credentials_secrets_are_mounted_into_driver_and_executors_and_passed_as_paths() -> None:
    app = build_scheduled_spark_application(parse_spec(SPECS["tls-creds-s3-secret"]))
    template = app["spec"]["template"]
    mounts = [
        {"name": "central-nats", "path": CREDENTIALS_DIR, "secretType": "Generic"},
        {"name": "central-tls", "path": TLS_DIR, "secretType": "Generic"},
    ]
    assert template["driver"]["secrets"] == mounts and template["executor"]["secrets"] == mounts
    args = job_args(app)
    assert (args.tls_scheme, args.tls_ca, args.tls_cert, args.tls_key) == (
        "manual", f"{TLS_DIR}/ca.crt", f"{TLS_DIR}/tls.crt", f"{TLS_DIR}/tls.key")
    assert args.credentials == f"{CREDENTIALS_DIR}/replicator.creds"
    files = connection_from_args(args).files  # the job accepts them as one TLS + .creds connection
    assert files.tls and files.key == f"{TLS_DIR}/tls.key" and files.creds == args.credentials
    # Only paths: the command line, Spark and Hadoop settings hold no secret, env only references.
    text = " ".join(template["arguments"])
    assert "BEGIN" not in text and all(
        a.startswith((CREDENTIALS_DIR, TLS_DIR)) for a in template["arguments"] if a.startswith("/"))
    for role in ("driver", "executor"):
        assert all("value" not in e and e["valueFrom"]["secretKeyRef"]["name"] == "fleet-s3"
                   for e in template[role]["env"])


def test_a_tls_secret_with_only_a_ca_passes_only_the_ca() -> None:
    app = build_scheduled_spark_application(parse_spec(SPECS["tls-creds-s3-secret"]), {"central-tls": {"ca.crt"}})
    args = job_args(app)
    assert (args.tls_ca, args.tls_cert, args.tls_key) == (f"{TLS_DIR}/ca.crt", None, None)


def test_s3a_output_brings_the_hadoop_aws_connector_and_credentials_from_the_secret() -> None:
    template = build_scheduled_spark_application(parse_spec(SPECS["tls-creds-s3-secret"]))["spec"]["template"]
    assert template["deps"] == {"packages": [HADOOP_AWS]}
    assert template["sparkConf"]["spark.jars.ivy"] == IVY_DIR
    assert template["hadoopConf"]["fs.s3a.aws.credentials.provider"] == S3_PROVIDER_ENV
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in template["executor"]["env"]}
    assert env == {
        "AWS_ACCESS_KEY_ID": {"name": "fleet-s3", "key": "AWS_ACCESS_KEY_ID"},
        "AWS_SECRET_ACCESS_KEY": {"name": "fleet-s3", "key": "AWS_SECRET_ACCESS_KEY"},
    }
    assert template["driver"]["env"] == template["executor"]["env"]

    identity = build_scheduled_spark_application(parse_spec(SPECS["s3a-pod-identity"]))["spec"]["template"]
    assert identity["deps"] == {"packages": [HADOOP_AWS]}
    assert "env" not in identity["driver"] and "env" not in identity["executor"]  # no Secret named
    assert identity["hadoopConf"] == {"fs.s3a.aws.credentials.provider": S3_PROVIDER_DEFAULT}


def test_hadoop_aws_matches_the_hadoop_bundled_in_the_installed_pyspark() -> None:
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    versions = {p.name.removeprefix("hadoop-client-api-").removesuffix(".jar")
                for p in jars.glob("hadoop-client-api-*.jar")}
    assert versions == {HADOOP_VERSION}
    assert HADOOP_AWS == f"org.apache.hadoop:hadoop-aws:{HADOOP_VERSION}"


@pytest.mark.parametrize(
    ("output", "changes", "message"),
    [
        ("gs://fleet/x", {}, r"gs:// file system connector.*spec\.fleetHealth\.packages.*gcs-connector"),
        ("abfss://c@acct.dfs.core.windows.net/x", {}, r"spec\.fleetHealth\.packages.*hadoop-azure"),
        ("abfs://c@acct.dfs.core.windows.net/x", {"packages": ["org.example:other:1.0"]}, "hadoop-azure"),
        ("s3://fleet/x", {}, "write s3a://"),
        ("/data/fleet", {"s3": {"credentialsSecret": {"name": "fleet-s3"}}}, r"spec\.fleetHealth\.s3"),
    ],
)
def test_object_stores_without_their_connector_are_refused(output: str, changes: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        build_scheduled_spark_application(parse_spec(resource(output=output, **changes)))


def test_a_declared_connector_is_used() -> None:
    template = build_scheduled_spark_application(parse_spec(SPECS["gcs-with-connector"]))["spec"]["template"]
    assert template["deps"] == {"packages": ["com.google.cloud.bigdataoss:gcs-connector:hadoop3-2.2.26"]}
    assert "hadoopConf" not in template


def test_the_s3_secret_is_checked_like_the_other_secrets() -> None:
    from replication_operator.checks.secrets import secret_needs
    from replication_operator.model.spec import parse_spec

    needs = {(n.secret, n.key) for n in secret_needs(parse_spec(SPECS["tls-creds-s3-secret"]))}
    assert {("fleet-s3", "AWS_ACCESS_KEY_ID"), ("fleet-s3", "AWS_SECRET_ACCESS_KEY"), ("central-tls", None),
            ("central-nats", "replicator.creds")} <= needs
