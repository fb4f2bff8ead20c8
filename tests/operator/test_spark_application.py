"""The fleet-health ScheduledSparkApplication builder against the real spark-operator CRD schema."""

from __future__ import annotations

import argparse
import copy
import functools
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
import yaml
from replication_operator.spark_application import (
    CREDENTIALS_DIR,
    MAIN_APPLICATION_FILE,
    build_scheduled_spark_application,
)
from replication_operator.spec import SpecError

from replicator.fleet_health.cli import add_arguments
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


SPECS = {
    "target-credentials": resource(),
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
    app = build_scheduled_spark_application(SPECS[name])
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
    template = build_scheduled_spark_application(SPECS["target-credentials"])["spec"]["template"]
    mount = [{"name": "central-nats", "path": CREDENTIALS_DIR, "secretType": "Generic"}]
    assert template["driver"]["secrets"] == mount and template["executor"]["secrets"] == mount
    args = job_args({"spec": {"template": template}})
    assert args.url == "nats://central.example.net:4222"
    assert args.credentials == f"{CREDENTIALS_DIR}/replicator.creds"
    assert (args.stream, args.partitions) == ("REPLICATOR_ADVISORIES", 6)  # 3 executors x 2 cores
    assert template["executor"]["instances"] == 3 and template["executor"]["memory"] == "2g"
    assert template["image"] == "registry.example.net/stream-replicator:0.1.0-spark"

    source = build_scheduled_spark_application(SPECS["source-cluster"])["spec"]["template"]
    assert source["driver"]["secrets"][0]["name"] == "source-nats"
    args = job_args({"spec": {"template": source}})
    assert args.url == "nats://source.example.net:4222"
    assert args.credentials == f"{CREDENTIALS_DIR}/user.creds"  # the CRD's default key


def test_minimal_spec_uses_defaults_and_finds_the_stream_by_subject() -> None:
    app = build_scheduled_spark_application(SPECS["minimal-by-subject"])
    template = app["spec"]["template"]
    assert "secrets" not in template["driver"] and "secrets" not in template["executor"]
    args = job_args(app)
    assert (args.stream, args.subject) == (None, "replicator.advisories.registrations")
    assert args.credentials is None and args.partitions == 2
    assert app["spec"]["schedule"] == "@every 1h" and app["spec"]["suspend"] is False


def test_overrides_pass_through() -> None:
    app = build_scheduled_spark_application(SPECS["suspended-s3a-conf"])
    assert app["spec"]["suspend"] is True and app["spec"]["timeZone"] == "Europe/Amsterdam"
    template = app["spec"]["template"]
    assert template["hadoopConf"]["fs.s3a.path.style.access"] == "true"
    assert template["sparkConf"] == {"spark.sql.shuffle.partitions": "16"}
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
        build_scheduled_spark_application(broken)
