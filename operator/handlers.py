"""kopf wiring: thin handlers that hand every trigger to the Reconciler.

`register()` builds the handlers into a given registry, so the CLI, the tests and the benchmark
each run the same handlers with their own settings (e.g. a short timer interval) side by side.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import Any

import kopf
from replication_operator.engine.target import NativeError
from replication_operator.kube import APIError
from replication_operator.model import naming
from replication_operator.model.spec import SpecError
from replication_operator.nats.connection import NatsStatusError
from replication_operator.reconcile.connection_watch import ConnectionWatch
from replication_operator.reconcile.reconciler import Reconciler, WorkersRunning

from replicator.observe.monitor import MonitorServer

RETRY_DELAY = 10.0
# Deleting a native-engine resource removes its source entry; when NATS cannot be reached for this
# long, the resource goes anyway (a Warning event says the entry is left behind).
FINALIZE_RETRIES = 30  # at FINALIZE_BACKOFF: worker pods get 90 s to stop before the durable is left
FINALIZE_BACKOFF = 3.0
CONNECTION_CHECK_MIN = 10.0  # a NatsConnection's connectivity is checked again at most this often (and on each edit)

Login = Callable[..., Any]  # kopf's login handler signature: returns a kopf.ConnectionInfo (or None)


def register(registry: kopf.OperatorRegistry, reconciler: Reconciler,
             login: Login = kopf.login_via_client, *, metrics_port: int | None = None,
             metrics_host: str = "0.0.0.0") -> None:
    """`login`: how to reach the API server; kopf's own connection and the operator's client
    (`reconciler.api`, the official client) both use what it returns. The default reads the
    in-cluster service account, else the kubeconfig, through the official client's loaders.
    `metrics_port`: serve the operator's `/metrics` there (0: any free port; None: not at all)."""
    config = reconciler.config
    resource = (naming.GROUP, naming.VERSION, naming.PLURAL)
    if metrics_port is not None:
        register_metrics(registry, reconciler, metrics_port, metrics_host)

    async def call_login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        info = login(**kwargs)
        return await info if inspect.isawaitable(info) else info  # type: ignore[no-any-return]

    @kopf.on.login(registry=registry)
    async def authenticate(**kwargs: Any) -> kopf.ConnectionInfo | None:
        info = await call_login(**kwargs)
        if info is not None:
            reconciler.api.use(info)
            reconciler.api.relogin = lambda: call_login(**kwargs)
        return info

    @kopf.on.cleanup(registry=registry)
    async def close_client(**_: Any) -> None:
        await reconciler.api.close()

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        """Our own annotation prefix and finalizer name; only warnings from kopf become Events."""
        settings.persistence.finalizer = naming.FINALIZER
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=naming.KOPF_PREFIX)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=naming.KOPF_PREFIX, key="last-handled-configuration"
        )
        settings.posting.level = logging.WARNING
        settings.networking.error_backoffs = [0.5, 1, 2, 4]
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        # A CR deleted while its status timer is mid-read (NATS) is released once the timer exits,
        # not at kopf's next 60 s cancellation poll: the timer stops its own work when told.
        settings.background.instant_exit_timeout = 5.0
        # Roles-only RBAC: kopf then serves the exact namespaces given and never lists namespaces
        # or watches CRDs (cluster-scoped calls); it sees new CRD versions only after a restart.
        settings.scanning.disabled = config.roles_only
        reconciler.api.settings = settings

    async def apply(body: kopf.Body, reason: str) -> None:
        outcome = await reconciler.reconcile(body, cause=str(reason))
        if outcome.retry:
            raise kopf.TemporaryError("; ".join(p.message for p in outcome.problems), delay=RETRY_DELAY)

    @kopf.on.create(*resource, id="apply-create", registry=registry)
    async def on_create(body: kopf.Body, reason: str, **_: Any) -> None:
        await apply(body, reason)

    @kopf.on.update(*resource, id="apply-update", registry=registry)
    async def on_update(body: kopf.Body, reason: str, **_: Any) -> None:
        await apply(body, reason)

    @kopf.on.resume(*resource, id="apply-resume", registry=registry)
    async def on_resume(body: kopf.Body, reason: str, **_: Any) -> None:
        await apply(body, reason)

    @kopf.timer(*resource, id="status", interval=config.status_interval,
                initial_delay=config.status_interval, registry=registry)
    async def on_timer(body: kopf.Body, **kwargs: Any) -> None:
        """Give up a slow NATS read when the resource goes or the operator stops: kopf waits for
        timers before it releases the finalizer or exits."""
        stopped: kopf.DaemonStopped = kwargs["stopped"]

        async def halted() -> None:
            await stopped.wait()

        tick = asyncio.create_task(reconciler.tick(body))
        halt = asyncio.create_task(halted())
        try:
            await asyncio.wait({tick, halt}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (tick, halt):
                task.cancel()
            await asyncio.gather(tick, halt, return_exceptions=True)
        if tick.done() and not tick.cancelled() and tick.exception():
            raise tick.exception()  # type: ignore[misc]

    @kopf.on.delete(*resource, id="remove-source-entry", registry=registry,
                    retries=FINALIZE_RETRIES, backoff=FINALIZE_BACKOFF)
    async def on_delete(body: kopf.Body, retry: int, **_: Any) -> None:
        """Native engine: remove our source entry from the target stream (the stream stays).
        Replicator engine: stop the pods, then delete the durable consumer on the source."""
        native = bool((body.get("status") or {}).get("native"))
        try:
            await reconciler.finalize(body)
        except SpecError:
            return
        except (NativeError, NatsStatusError, WorkersRunning, APIError) as err:
            # A durable the operator never read (no status.lag) may never have existed: a source that
            # cannot be reached does not hold the deletion up.
            seen = native or "lag" in (body.get("status") or {}) or isinstance(err, WorkersRunning)
            if retry + 1 >= FINALIZE_RETRIES or not seen:
                reason, what = (("SourceEntryLeft", "the source entry, left on the target stream") if native else
                                ("DurableLeft", "the durable consumer, left on the source (delete it with nats "
                                 "consumer rm)"))
                reconciler.events.post(body, "Warning", reason, f"could not remove {what}: {err}")
                return
            raise kopf.TemporaryError(str(err), delay=FINALIZE_BACKOFF) from None

    @kopf.on.event(*resource, id="forget", registry=registry)
    def on_resource_event(type: str, body: kopf.Body, **_: Any) -> None:
        if type == "DELETED":
            reconciler.forget(body["metadata"]["uid"])

    for kind in naming.CHILD_KINDS:
        register_child_watch(registry, reconciler, kind)
    register_connection_watch(registry, reconciler)

    @kopf.on.probe(id="resources", registry=registry)
    def count_resources(**_: Any) -> int:
        return len(reconciler.memory)


def register_child_watch(registry: kopf.OperatorRegistry, reconciler: Reconciler, kind: naming.Kind) -> None:
    """Watch one child kind (ours only, by label): restore deleted or edited children, follow Deployments."""

    @kopf.on.event(kind.group, kind.version, kind.plural, id=f"child-{kind.plural}",
                   labels={naming.LABEL_MANAGED_BY: naming.MANAGER}, registry=registry)
    async def on_child(type: str, body: kopf.Body, **_: Any) -> None:
        await reconciler.on_child_event(type or "", body)


def register_connection_watch(registry: kopf.OperatorRegistry, reconciler: Reconciler) -> ConnectionWatch:
    """NatsConnections: their users indexed from the StreamReplications' events, their changes handed on
    to those users, their connectivity checked (no finalizer and no annotation on them: events only)."""
    watch = ConnectionWatch(reconciler, interval=max(reconciler.config.status_interval, CONNECTION_CHECK_MIN))

    @kopf.on.event(naming.GROUP, naming.VERSION, naming.PLURAL, id="connection-users", registry=registry)
    def on_user(type: str, body: kopf.Body, **_: Any) -> None:
        watch.on_user_event(type or "", body)

    @kopf.on.event(naming.GROUP, naming.VERSION, naming.CONNECTION_PLURAL, id="connection", registry=registry)
    async def on_connection(type: str, body: kopf.Body, **_: Any) -> None:
        await watch.on_connection_event(type or "", body)

    @kopf.on.startup(id="connection-checks-start", registry=registry)
    async def start_checks(**_: Any) -> None:
        watch.start()

    @kopf.on.cleanup(id="connection-checks-stop", registry=registry)
    async def stop_checks(**_: Any) -> None:
        await watch.stop()

    return watch


def register_metrics(registry: kopf.OperatorRegistry, reconciler: Reconciler, port: int, host: str) -> None:
    """`/metrics` (and `/healthz`, `/readyz`) for the operator's life, on the replicator's monitor server."""
    server = MonitorServer(reconciler.metrics.registry, lambda: (True, {}), port, host)
    reconciler.metrics_server = server

    @kopf.on.startup(id="metrics-start", registry=registry)
    async def start_metrics(**_: Any) -> None:
        """A port in use must not hold up reconciling (kopf would retry this for ever): say so, go on."""
        log = logging.getLogger("replication_operator")
        try:
            await server.start()
        except OSError as err:
            log.error("cannot serve /metrics on port %d: %s (continuing without metrics)", port, err.strerror or err)
            return
        log.info("metrics on port %d: /metrics", server.port)

    @kopf.on.cleanup(id="metrics-stop", registry=registry)
    async def stop_metrics(**_: Any) -> None:
        await server.stop()
