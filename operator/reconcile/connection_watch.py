"""NatsConnections as the operator follows them: who uses each (an index of StreamReplications by
`connectionRef`), whether it can connect, and its users reconciled again when it changes.

kopf hands every event of both kinds here (handlers.py). A new spec generation of a NatsConnection
reconciles each user (their ConfigMap, Deployment and mounts follow it) and checks it at once; a
background loop checks every connection again each `interval` and writes its status (users and the
`Connected` condition) only when it changed. The check connects as the workers would, with the
connection's own Secrets under the tenancy policy; its messages name Secrets and hosts, never values.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from replication_operator.checks import policy
from replication_operator.checks.secrets import read_connection_auth
from replication_operator.kube import APIError, error_text
from replication_operator.model import connection as model
from replication_operator.model import naming
from replication_operator.model import status as st
from replication_operator.model.spec import SpecError
from replication_operator.nats import connection
from replication_operator.reconcile.reconciler import Reconciler

from replicator.config import redact_url

log = logging.getLogger("replication_operator")
Key = tuple[str, str]  # (namespace, name)


class ConnectionWatch:
    """The operator's view of every NatsConnection; one per Reconciler."""

    def __init__(self, reconciler: Reconciler, interval: float) -> None:
        self.reconciler = reconciler
        self.interval = interval
        self.users: dict[Key, set[str]] = {}  # NatsConnection -> StreamReplications naming it
        self.named: dict[Key, set[str]] = {}  # StreamReplication -> the NatsConnections it names
        self.known: dict[Key, dict[str, Any]] = {}  # NatsConnection -> its last body
        self.generations: dict[Key, int | None] = {}  # the generation whose users were last reconciled
        self.written: dict[Key, dict[str, Any]] = {}  # the status last written
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    # ---- the index of users ----
    def on_user_event(self, event_type: str, body: Mapping[str, Any]) -> None:
        """A StreamReplication appeared, changed or went: the connections it names are updated."""
        meta = body.get("metadata") or {}
        ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        now = set() if event_type == "DELETED" else model.references_of(body)
        before = self.named.get((ns, name), set())
        if now == before:
            return
        for conn in before - now:
            self.users.get((ns, conn), set()).discard(name)
        for conn in now - before:
            self.users.setdefault((ns, conn), set()).add(name)
        if now:
            self.named[(ns, name)] = now
        else:
            self.named.pop((ns, name), None)
        self.wake.set()  # the users lists changed

    def users_of(self, key: Key) -> list[str]:
        return sorted(self.users.get(key, set()))

    # ---- the connections ----
    async def on_connection_event(self, event_type: str, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        if event_type == "DELETED":
            self.known.pop(key, None)
            self.generations.pop(key, None)
            self.written.pop(key, None)
            await self._reconcile_users(key)  # they report ConnectionMissing
            return
        self.known[key] = dict(body)
        generation = meta.get("generation")
        if key in self.generations and self.generations[key] == generation:
            return  # our own status write, or nothing the users read
        first = key not in self.generations
        self.generations[key] = generation
        await self.check(key)
        if not first or self.users.get(key):
            await self._reconcile_users(key)

    async def _reconcile_users(self, key: Key) -> None:
        """Each user's pass, with the connection as it is now: its children follow it."""
        ns = key[0]
        for name in self.users_of(key):
            owner = await self.reconciler._owner(ns, name)
            if owner is not None:
                await self.reconciler.reconcile(owner, cause="connection")

    async def check(self, key: Key) -> None:
        """Connect with the connection's credentials and write its status if it changed."""
        body = self.known.get(key)
        if body is None:
            return
        condition, server = await self._probe(key, body)
        generation = (body.get("metadata") or {}).get("generation")
        if generation is not None:
            condition["observedGeneration"] = generation
        old = self.written.get(key) or body.get("status") or {}
        status: dict[str, Any] = {
            "observedGeneration": generation, "users": self.users_of(key),
            "conditions": st.merge_conditions(old.get("conditions"), [condition], self.reconciler.clock()),
        }
        if server:
            status["server"] = server
        if self.written.get(key) == status:
            return
        try:
            await self.reconciler.api.patch_status(naming.NATS_CONNECTION, key[0], key[1], status)
        except APIError as err:
            log.warning("cannot write the status of natsconnection %s/%s: %s", *key, error_text(err))
            return
        self.written[key] = status

    async def _probe(self, key: Key, body: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
        """The Connected condition (without times) and the server reached."""
        ns = key[0]
        rules = self.reconciler.policy
        try:
            spec = model.parse_connection(body)
        except SpecError as err:
            return _condition(False, model.INVALID, str(err)), None
        refused = [host for host in dict.fromkeys(policy.hosts_of(spec.url)) if not policy.host_allowed(rules, host)]
        if refused:
            return _condition(False, policy.HOST_NOT_ALLOWED, (
                f'host "{refused[0]}" is not an allowed NATS host (set by --allow-nats-host): not connected')), None
        try:
            auth = await read_connection_auth(self.reconciler.api, rules, ns, spec)
        except connection.NatsStatusError as err:
            return _condition(False, model.SECRETS_UNUSABLE, str(err)), None
        try:
            nc = await connection.connect(spec.url, auth, self.reconciler.config.nats_timeout)
        except connection.NatsStatusError as err:
            return _condition(False, model.UNREACHABLE, str(err)), None
        try:
            info = nc._server_info or {}
            server = f"{info.get('server_name') or info.get('server_id') or '?'} {info.get('version') or ''}".strip()
        finally:
            with contextlib.suppress(*connection.CONNECT_FAILURES):
                await nc.close()
        return _condition(True, model.REACHABLE, f"signed in to {redact_url(spec.url)} (server {server})"), server

    # ---- the loop ----
    def start(self) -> None:
        self.task = asyncio.create_task(self._loop(), name="natsconnection-checks")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.interval)
            self.wake.clear()
            for key in list(self.known):
                try:
                    await self.check(key)
                except Exception:  # a boundary: the loop outlives one connection's bug (logged, tried again)
                    log.exception("checking natsconnection %s/%s failed", *key)


def _condition(ok: bool, reason: str, message: str) -> dict[str, Any]:
    return {"type": model.CONNECTED, "status": "True" if ok else "False", "reason": reason, "message": message}
