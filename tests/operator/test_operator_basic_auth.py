"""`basicAuthSecret` (a user name and password in a Secret) in the pure builders: mounted read-only into
the worker pods and the fleet-health job, named in the config and the job's arguments by path only,
exclusive with the other ways to authenticate a side, and advice for a password left in a URL."""

from __future__ import annotations

import argparse
import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from replication_operator.build import worker_config
from replication_operator.build.children import BuildOptions, Children, build_children
from replication_operator.build.spark_application import BASIC_AUTH_DIR, TLS_DIR, build_scheduled_spark_application
from replication_operator.checks import advice
from replication_operator.checks.secrets import secret_needs
from replication_operator.model import naming
from replication_operator.model.spec import SpecError, parse_spec

from replicator.config import Profile, parse_config
from replicator.fleet_health.cli import add_arguments, connection_from_args
from replicator.transport.connections import material_for
from tests.operator import helpers as h
from tests.operator.test_operator_builders import _validate

PASSWORD = "pw-Kq9-never-in-a-configmap"
SECRETS = {
    "dc2-nats-login": {"username": b"replicator", "password": PASSWORD.encode()},
    "central-nats-login": {"user": b"dc2", "pass": b"central-pw-3x\n"},
    "central-ca": {"ca.crt": b"fake ca"},
}


def _example(**changes: Any) -> dict[str, Any]:
    resource = h.example("orders-dc2")
    resource["spec"].update(changes)
    return resource


def _topic(children: Children) -> dict[str, Any]:
    (topic,) = yaml.safe_load(children.config_text)["topics"].values()
    return dict(topic)


def test_the_secret_is_mounted_read_only_and_only_paths_reach_the_config() -> None:
    children = build_children(parse_spec(_example()))
    deployment = h.child_of(children, naming.DEPLOYMENT)
    assert deployment is not None
    pod = deployment["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["source-basic-auth"]["secret"] == {
        "secretName": "dc2-nats-login", "defaultMode": 0o440,
        "items": [{"key": "username", "path": "username"}, {"key": "password", "path": "password"}]}
    assert volumes["target-basic-auth"]["secret"]["items"] == [{"key": "user", "path": "user"},
                                                               {"key": "pass", "path": "pass"}]
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    for side in ("source", "target"):
        mount = mounts[f"{side}-basic-auth"]
        assert mount["readOnly"] and mount["mountPath"] == worker_config.basic_auth_dir(side)  # type: ignore[arg-type]
        assert "subPath" not in mount  # kubelet updates whole volumes only: rotation needs this
    topic = _topic(children)
    assert (topic["source_user_file"], topic["source_password_file"]) == (
        f"{naming.SECRETS_DIR}/source-basic-auth/username", f"{naming.SECRETS_DIR}/source-basic-auth/password")
    assert (topic["target_user_file"], topic["target_password_file"]) == (
        f"{naming.SECRETS_DIR}/target-basic-auth/user", f"{naming.SECRETS_DIR}/target-basic-auth/pass")
    assert "source_credentials" not in topic and "@" not in topic["source_url"]
    container = pod["containers"][0]
    assert all("secretKeyRef" not in str(e) for e in container["env"])  # never an env var
    _validate(deployment)


def test_the_worker_reads_the_mounted_files(tmp_path: Path) -> None:
    """The ConfigMap, with the Secrets' files where the pod has them, loads in the worker, passes
    its start-up file check and yields the user and password of the Secret (TLS aside here)."""
    resource = _example()
    resource["spec"]["target"].pop("tlsSecret")
    children = build_children(parse_spec(resource))
    deployment = h.child_of(children, naming.DEPLOYMENT)
    assert deployment is not None
    config = h.materialise(children.config_text, tmp_path, SECRETS, h.secret_mounts(deployment))
    profile = Profile(parse_config(config, "configmap"), "orders-dc2")
    profile.check_files()
    for side, user, password in (("source", "replicator", PASSWORD), ("target", "dc2", "central-pw-3x")):
        source = material_for(profile, side)  # type: ignore[arg-type]
        assert source is not None
        basic = source.load().basic
        assert basic is not None and (basic.user, basic.password) == (user, password)


def test_the_secrets_keys_are_checked_like_the_others() -> None:
    needs = {(n.side, n.secret, n.key) for n in secret_needs(parse_spec(_example()))}
    assert needs == {("source", "dc2-nats-login", "username"), ("source", "dc2-nats-login", "password"),
                     ("target", "central-nats-login", "user"), ("target", "central-nats-login", "pass"),
                     ("target", "central-ca", None)}
    assert parse_spec(_example()).target.secrets == ["central-nats-login", "central-ca"]


EXCLUSIVE = [
    ({"credentialsSecret": {"name": "dc2-creds"}},
     "spec.source.credentialsSecret and spec.source.basicAuthSecret exclude each other: one way to "
     "authenticate the source", "credentialsSecret, basicAuthSecret, tokenSecret and nkeySecret exclude each other"),
    ({"url": f"nats://replicator:{PASSWORD}@nats.dc2.example.net:4222"},
     "spec.source.basicAuthSecret and a user:password in spec.source.url exclude each other",
     "basicAuthSecret, tokenSecret or nkeySecret and credentials in the url"),
    ({"url": "nats://s3cr3t-token@nats.dc2.example.net:4222"},
     "spec.source.basicAuthSecret and a token in spec.source.url exclude each other",
     "basicAuthSecret, tokenSecret or nkeySecret and credentials in the url"),
]


@pytest.mark.parametrize(("change", "operator_message", "crd_message"), EXCLUSIVE,
                         ids=["credentialsSecret", "user:password in url", "token in url"])
def test_one_way_to_authenticate_a_side(change: dict[str, Any], operator_message: str, crd_message: str) -> None:
    """Refused by the CRD (CEL) and, for objects the API server never checked, by the operator,
    with the resource's field names; the password is never in the message."""
    resource = _example()
    resource["spec"]["source"].update(change)
    with pytest.raises(SpecError) as err:
        parse_spec(resource)
    assert operator_message in str(err.value) and PASSWORD not in str(err.value), err.value
    errors = h.cr_errors(resource)
    assert any(crd_message in e for e in errors), errors


def test_credentials_secret_and_a_password_in_the_url_exclude_each_other_too() -> None:
    resource = h.example("cmdb-city1")
    resource["spec"]["source"]["url"] = f"nats://sr:{PASSWORD}@nats.city1.example.net:4222"
    with pytest.raises(SpecError, match=r"spec.source.credentialsSecret and a user:password in spec.source.url"):
        parse_spec(resource)


def test_the_two_keys_must_differ() -> None:
    resource = _example()
    resource["spec"]["target"]["basicAuthSecret"] = {"name": "x", "usernameKey": "k", "passwordKey": "k"}
    with pytest.raises(SpecError, match="usernameKey and passwordKey must differ"):
        parse_spec(resource)
    assert any("must differ" in e for e in h.cr_errors(resource))


def test_heartbeats_sign_in_with_their_sides_files() -> None:
    resource = _example(heartbeats={"subjects": [{"subject": "orders.dc2.heartbeat"}], "cluster": "target"})
    heartbeats = yaml.safe_load(build_children(parse_spec(resource)).config_text)["heartbeats"]
    assert (heartbeats["user_file"], heartbeats["password_file"]) == (
        f"{naming.SECRETS_DIR}/target-basic-auth/user", f"{naming.SECRETS_DIR}/target-basic-auth/pass")
    assert "credentials" not in heartbeats


def _fleet(resource: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(resource)
    out["spec"].update(sampling={"inspect": "order.site", "age": "1h"}, advisory={"subject": "orders.advisories"},
                       fleetHealth={"stream": "ORDER_ADVISORIES", "output": "/data/fleet"})
    return out


def _job_args(app: dict[str, Any]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(app["spec"]["template"]["arguments"])


def test_the_fleet_health_job_mounts_the_secret_and_reads_the_files() -> None:
    """Driver and executors mount the advisory cluster's Secret; the arguments name the two files
    (the job reads them at each connect), never the password; the object passes the Spark operator's
    schema."""
    children = build_children(parse_spec(_fleet(_example())), BuildOptions(spark_image="stream-replicator:0.1.0-spark",
                                                               tls_keys={"central-ca": {"ca.crt"}}))
    app = h.child_of(children, naming.SCHEDULED_SPARK_APPLICATION)
    assert app is not None
    _validate(app)
    template = app["spec"]["template"]
    mounts = [{"name": "central-nats-login", "path": BASIC_AUTH_DIR, "secretType": "Generic"},
              {"name": "central-ca", "path": TLS_DIR, "secretType": "Generic"}]
    assert template["driver"]["secrets"] == mounts and template["executor"]["secrets"] == mounts
    args = _job_args(app)
    assert (args.user_file, args.password_file) == (f"{BASIC_AUTH_DIR}/user", f"{BASIC_AUTH_DIR}/pass")
    assert args.credentials is None and args.url == "tls://nats.central.example.net:4222"
    files = connection_from_args(args).files
    assert (files.username, files.password, files.ca) == (args.user_file, args.password_file, f"{TLS_DIR}/ca.crt")
    assert all(a.startswith((BASIC_AUTH_DIR, TLS_DIR)) for a in template["arguments"] if a.startswith("/etc"))


def test_the_fleet_health_job_refuses_two_ways_to_authenticate() -> None:
    """Two Secrets on the advisory side are refused as the spec is read (the typed model cannot hold
    them), a password in the job's own URL by the Spark builder."""
    resource = _fleet(_example())
    resource["spec"]["target"]["credentialsSecret"] = {"name": "central-creds"}
    with pytest.raises(SpecError, match=r"spec\.target\.credentialsSecret and spec\.target\.basicAuthSecret exclude "
                                        "each other"):
        build_scheduled_spark_application(parse_spec(resource))
    resource = _fleet(_example())
    resource["spec"]["fleetHealth"]["url"] = f"nats://fh:{PASSWORD}@fleet.example.net:4222"
    with pytest.raises(SpecError, match=r"spec\.fleetHealth\.url carries credentials") as err:
        build_scheduled_spark_application(parse_spec(resource))
    assert PASSWORD not in str(err.value)


def test_a_password_in_a_url_is_built_with_advice() -> None:
    """Still accepted (resources written before basicAuthSecret keep working), with a warning that
    names the field and the remedy, the URL redacted."""
    resource = h.example("cmdb-city1")
    resource["spec"]["source"].pop("credentialsSecret")
    resource["spec"]["source"]["url"] = f"nats://sr:{PASSWORD}@nats.city1.example.net:4222"
    resource["spec"]["target"]["url"] = "nats://only-a-token@nats-0.region-eu.example.net:4222"
    children = build_children(parse_spec(resource))
    assert PASSWORD in children.config_text  # compatibility: the URL goes to the worker as written
    given = advice.advise(parse_spec(resource))
    assert [reason for reason, _ in given] == [advice.PASSWORD_IN_URL]  # a token has no basicAuthSecret to go to
    message = given[0][1]
    assert PASSWORD not in message
    assert message.startswith("spec.source.url carries a user and password (nats://***@nats.city1.example.net:4222)")
    assert "spec.source.basicAuthSecret" in message
    assert advice.advise(parse_spec(_example())) == []
    fleet = _fleet(h.example("cmdb-city1"))
    fleet["spec"]["fleetHealth"]["url"] = f"nats://fh:{PASSWORD}@fleet.example.net:4222"
    (_, message), = advice.advise(parse_spec(fleet))
    assert message.startswith("spec.fleetHealth.url carries") and "spec.target.basicAuthSecret" in message
