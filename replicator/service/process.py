"""One process: some profiles of a config file (each its own copier), one monitor, heartbeats.

`stream-replicator run --topic T` runs one profile this way; `stream-replicator replicate` runs
every profile of the file, as the Go Stream Replicator runs every entry of its `streams:` list.
The profiles share one metrics registry and one monitor, which for a Go-format file also serves
the Go tool's `choria_stream_replicator_*` families; heartbeats run beside them when configured.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
from collections.abc import Iterable

from replicator.config.model import Config, Profile
from replicator.heartbeats import Heartbeats, heartbeat_profile
from replicator.observe.gometrics import GoMetrics, GoStream, Sample
from replicator.observe.metrics import Metrics
from replicator.observe.monitor import MonitorServer
from replicator.service.compiled import describe as describe_build
from replicator.service.runner import Replicator

log = logging.getLogger(__name__)


def site_name(config: Config, profiles: list[Profile]) -> str:
    """The replicator (site) name heartbeats carry: `name`, else the first profile's, else the host's."""
    if config.name:
        return config.name
    return profiles[0].metrics_name if profiles else socket.gethostname()


COLLECT_EVERY = 50_000  # container allocations between the cyclic collector's young collections


def tune_collector() -> None:
    """For a process that copies: a copy allocates a few short-lived objects per message and keeps
    thousands alive in its window, so with Python's default (a young collection every 700
    allocations, and older ones walking the window again and again) the collector took a fifth of
    the copier's time. What start-up loaded is frozen out of its walks; young collections run
    every `COLLECT_EVERY` allocations. Called by the commands that replicate, not on import."""
    gc.freeze()
    gc.set_threshold(COLLECT_EVERY, 20, 20)


class ReplicatorProcess:
    """Runs `profiles` (and the config's heartbeats) until `stop()` or SIGTERM/SIGINT."""

    def __init__(self, config: Config, profiles: list[Profile], *, monitor_port: int | None = None,
                 metrics: Metrics | None = None) -> None:
        self.config = config
        self.profiles = profiles
        self.metrics = metrics or Metrics()
        self.replicators = [Replicator(p, metrics=self.metrics, serve_monitor=False) for p in profiles]
        self.ports = sorted({monitor_port} if monitor_port is not None
                            else {p.settings.monitor for p in profiles if p.settings.monitor is not None})
        self.monitors: list[MonitorServer] = []
        self.go_metrics: GoMetrics | None = None
        if config.dialect == "go" or config.heartbeats is not None:
            self.go_metrics = GoMetrics(self.metrics.registry)
            for p in profiles:
                if p.go is not None:
                    self.go_metrics.add_stream(p.metrics_name, GoStream(p.go.stream, p.go.replicator, p.go.name,
                                                                        p.durable_name))
            self.go_metrics.add_source(self._stream_samples)
        self.heartbeats: Heartbeats | None = None
        if config.heartbeats is not None:
            name = site_name(config, profiles)
            self.heartbeats = Heartbeats(config.heartbeats, heartbeat_profile(config, name), name)
            assert self.go_metrics is not None
            self.go_metrics.add_source(self.heartbeats.samples)
        self._stopping = False

    def readiness(self) -> tuple[bool, dict[str, object]]:
        workers: dict[str, object] = {}
        ready = True
        for r in self.replicators:
            ok, detail = r.readiness()
            ready = ready and ok
            part = detail.get("workers")
            if isinstance(part, dict):
                workers.update(part)
        return ready, {"workers": workers}

    def install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)

    def stop(self) -> None:
        self._stopping = True
        for r in self.replicators:
            r.stop()
        if self.heartbeats is not None:
            self.heartbeats.stop()

    @property
    def monitor_port(self) -> int | None:
        return self.monitors[0].port if self.monitors else None

    async def run(self) -> None:
        extra = self.go_metrics.render if self.go_metrics is not None else None
        log.info("%s", describe_build())
        try:
            for port in self.ports:
                monitor = MonitorServer(self.metrics.registry, self.readiness, port, extra=extra)
                await monitor.start()
                self.monitors.append(monitor)
                log.info("monitor on port %d: /metrics /healthz /readyz", monitor.port)
            tasks = [asyncio.ensure_future(r.run()) for r in self.replicators]
            if self.heartbeats is not None:
                tasks.append(asyncio.ensure_future(self.heartbeats.run()))
            try:
                # One profile failing for good (TLS, credentials) stops them all: a supervisor restarts
                # the process, and a half-running process would hide the problem.
                await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            finally:
                if not all(t.done() for t in tasks):  # a failure, or we were cancelled: stop the rest
                    self.stop()
                results = await asyncio.gather(*tasks, return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException):
                    raise result
        finally:
            for monitor in self.monitors:
                with contextlib.suppress(Exception):
                    await monitor.stop()

    def _stream_samples(self) -> Iterable[Sample]:
        """Elections and advisory failures of the Go-format profiles, labelled the Go tool's way."""
        for r in self.replicators:
            go, plane = r.profile.go, r.sampling
            if go is None or plane is None:
                continue
            if plane.election is not None:
                yield from plane.election.samples(go.election_name or r.profile.base_name, go.replicator)
            if plane.advisor is not None:
                for event, errors in plane.advisor.errors_by_event.items():
                    yield "advisor_publish_errors", {"advisory": event, "stream": go.stream,
                                                     "replicator": go.replicator}, float(errors)
