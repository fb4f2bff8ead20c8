"""The NatsConnections a resource names: read from the API and laid into its spec, before the policy,
the Secrets check, the builders and the operator's own connections see it (so a referenced
connection is policed, mounted and used exactly as an inline one).

A missing or unreadable NatsConnection is `ConnectionMissing` naming it; one whose spec cannot be read
is `InvalidSpec` naming it. Either way nothing is built from the resource.
"""

from __future__ import annotations

from replication_operator.kube import APIError, KubeApi, error_text
from replication_operator.model import naming
from replication_operator.model import status as st
from replication_operator.model.connection import NatsConnectionSpec, parse_connection, references, resolved
from replication_operator.model.spec import ReplicationSpec, SpecError


class ConnectionUnusable(Exception):
    """A named NatsConnection cannot be used; `problem` says why (safe to show)."""

    def __init__(self, problem: st.Problem) -> None:
        super().__init__(problem.message)
        self.problem = problem


async def read_connection(api: KubeApi, namespace: str, name: str, where: str) -> NatsConnectionSpec:
    """One NatsConnection's spec; ConnectionUnusable names it and the field that named it (`where`)."""
    try:
        body = await api.get(naming.NATS_CONNECTION, namespace, name)
    except APIError as err:
        raise ConnectionUnusable(st.Problem(st.CONNECTION_MISSING, (
            f'natsconnection "{name}" ({where}) cannot be read in namespace "{namespace}": '
            f"{error_text(err)}"))) from None
    if body is None:
        raise ConnectionUnusable(st.Problem(st.CONNECTION_MISSING, (
            f'natsconnection "{name}" ({where}) not found in namespace "{namespace}"')))
    try:
        return parse_connection(body)
    except SpecError as err:
        raise ConnectionUnusable(st.Problem(st.INVALID_SPEC, f"{err} ({where})")) from None


async def resolve(api: KubeApi, spec: ReplicationSpec) -> ReplicationSpec:
    """`spec` with its NatsConnections' fields laid in; ConnectionUnusable for the first that cannot be."""
    named = references(spec)
    if not named:
        return spec
    found = {}
    for side, name in named.items():
        if name not in found:
            found[name] = await read_connection(api, spec.namespace, name, f"spec.{side}.connectionRef")
    return resolved(spec, found)


async def resolve_all(api: KubeApi, spec: ReplicationSpec) -> tuple[ReplicationSpec | None, list[st.Problem]]:
    """The pass's form: the resolved spec, or None and every side's problem."""
    try:
        return await resolve(api, spec), []
    except ConnectionUnusable as first:
        problems = [first.problem]
    for side, name in references(spec).items():
        try:
            await read_connection(api, spec.namespace, name, f"spec.{side}.connectionRef")
        except ConnectionUnusable as err:
            if err.problem not in problems:
                problems.append(err.problem)
    return None, problems
