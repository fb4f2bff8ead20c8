"""NatsConnection: one NATS cluster's URLs, TLS and credential Secrets, named by the source and target
of many StreamReplications (`connectionRef`) instead of written into each.

Its spec is the side models' `Connection` itself (model/connection_fields.py): the same fields, rules and
descriptions, so a referenced connection is read, mounted and policed exactly as an inline one.
`resolved` lays a NatsConnection's fields into the sides that name it (pure); the reconciler does
that before the policy, the Secrets check and the builders see the spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import ValidationError
from replication_operator.model.connection_fields import ONE_WAY_RULES, Connection
from replication_operator.model.fields import Model, field
from replication_operator.model.spec import (
    Endpoint,
    ReplicationSpec,
    Side,
    SpecError,
    problem_text,
)
from replication_operator.model.status_schema import Condition

CONNECTED = "Connected"  # condition type: the operator signed in with the connection's credentials
REACHABLE = "Reachable"  # reason: it could
UNREACHABLE = "Unreachable"  # reason: the servers did not answer, or refused the credentials
SECRETS_UNUSABLE = "SecretsUnusable"  # reason: a Secret or CA ConfigMap is missing or refused by the policy
INVALID = "InvalidSpec"  # reason: the spec cannot be read


class NatsConnectionSpec(Connection):
    """A NATS cluster as StreamReplications reach it."""

    model_config = {"json_schema_extra": {"x-kubernetes-validations": ONE_WAY_RULES}}
    side: ClassVar[str] = ""


class NatsConnectionStatus(Model):
    """What the operator observed of a NatsConnection."""

    observed_generation: int | None = field("The spec generation the status was computed for.", None,
                                            format="int64", minimum=0)
    users: list[str] | None = field(
        "The StreamReplications in this namespace whose source or target names this connection (connectionRef).",
        None)
    conditions: list[Condition] | None = field(
        "Connected: whether the operator could sign in to the servers with this connection's credentials and TLS "
        "(reason Reachable, Unreachable, SecretsUnusable or InvalidSpec; messages never carry a credential).",
        None, **{"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]})
    server: str | None = field("The NATS server last reached: its name and version.", None)
    last_checked: str | None = field("When the operator last tried to connect.", None, format="date-time")


class NatsConnection(Model):
    api_version: str | None = field(
        "APIVersion defines the versioned schema of this representation of an object.", None)
    kind: str | None = field("Kind is a string value representing the REST resource this object represents.", None)
    metadata: dict[str, Any] | None = field("Standard object metadata: name, namespace, labels, annotations.", None)
    spec: NatsConnectionSpec = field(
        "The NATS cluster's URLs, TLS and one way to authenticate, shared by the StreamReplications that name it.")
    status: NatsConnectionStatus | None = field("What the operator observed; written by the operator only.", None)


def parse_connection(body: Mapping[str, Any]) -> NatsConnectionSpec:
    """A NatsConnection's spec, typed; SpecError names the NatsConnection and the field."""
    name = str((body.get("metadata") or {}).get("name") or "")
    try:
        return NatsConnectionSpec.model_validate(body.get("spec") or {})
    except ValidationError as err:
        problems = dict.fromkeys(problem_text(e) for e in err.errors(include_url=False))
        raise SpecError(f'natsconnection "{name}": ' + "; ".join(problems)) from None


def references(spec: ReplicationSpec) -> dict[Side, str]:
    """Side -> the NatsConnection it names."""
    sides: tuple[Side, Side] = ("source", "target")
    return {side: ref.name for side in sides if (ref := spec.endpoint(side).connection_ref) is not None}


def references_of(body: Mapping[str, Any]) -> set[str]:
    """The NatsConnections a raw resource names (for the index: even a spec that does not parse)."""
    raw = body.get("spec") or {}
    names = set()
    for side in ("source", "target"):
        ref = (raw.get(side) or {}).get("connectionRef") if isinstance(raw.get(side), Mapping) else None
        if isinstance(ref, Mapping) and ref.get("name"):
            names.add(str(ref["name"]))
    return names


def with_connection(endpoint: Endpoint, connection: Connection) -> Endpoint:
    """The side with the connection's fields laid in (its connectionRef kept: it says where they came from)."""
    return endpoint.model_copy(update={name: getattr(connection, name) for name in Connection.model_fields})


def resolved(spec: ReplicationSpec, connections: Mapping[str, Connection]) -> ReplicationSpec:
    """`spec` with every side that names a NatsConnection given that connection's fields."""
    update = {side: with_connection(spec.endpoint(side), connections[name])
              for side, name in references(spec).items()}
    return spec.model_copy(update=update) if update else spec
