"""One process: some profiles of a config file (each its own copier), one monitor, heartbeats.

`stream-replicator run --topic T` runs one profile this way; `stream-replicator replicate` runs
every profile of the file, as the Go Stream Replicator runs every entry of its `streams:` list.
The profiles share one metrics registry and one monitor, which for a Go-format file also serves
the Go tool's `choria_stream_replicator_*` families; heartbeats run beside them when configured.

With a `loader` (`replicate --reload`) the process also reloads its file when it changes (and on
SIGHUP): the profiles a new file adds start, the ones it removes stop cleanly (in-flight copies
finished and acknowledged, as at SIGTERM), a changed one stops cleanly and starts again with its new
settings, and every other profile keeps running untouched: its connections, consumer, window and
counters. A file that does not load leaves everything running as it was (`reload.py`). In such a
pool a profile failing for good (TLS, credentials) stops alone and starts again after a backoff;
without a loader it stops the process, for a supervisor to restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from replicator.config.errors import ConfigError
from replicator.config.model import Config, Profile
from replicator.observe.metrics import Metrics
from replicator.observe.monitor import MonitorServer
from replicator.service.compiled import describe as describe_build
from replicator.service.reload import WATCH_INTERVAL, ConfigWatch, Loader, Plan, plan
from replicator.service.runner import Replicator

if TYPE_CHECKING:  # imported when a Go-format file or heartbeats need them
    from replicator.heartbeats import Heartbeats
    from replicator.observe.gometrics import GoMetrics, Sample

log = logging.getLogger(__name__)


def site_name(config: Config, profiles: list[Profile]) -> str:
    """The replicator (site) name heartbeats carry: `name`, else the first profile's, else the host's."""
    if config.name:
        return config.name
    return profiles[0].metrics_name if profiles else socket.gethostname()


RETRY_FIRST = 30.0  # seconds before a pool's profile that failed for good starts again, doubling
RETRY_MAX = 600.0

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
    """Runs `profiles` (and the config's heartbeats) until `stop()` or SIGTERM/SIGINT; with a
    `loader`, reloads them when `watch` (the config file) changes or on SIGHUP."""

    def __init__(self, config: Config, profiles: list[Profile], *, monitor_port: int | None = None,
                 metrics: Metrics | None = None, loader: Loader | None = None, watch: str | None = None) -> None:
        self.config = config
        self.metrics = metrics or Metrics()
        self.monitor_override = monitor_port
        self.loader = loader
        self.watch = ConfigWatch(watch) if watch is not None and loader is not None else None
        self.running: dict[str, Replicator] = {p.profile: self._replicator(p) for p in profiles}
        self.tasks: dict[str, asyncio.Future[None]] = {}
        self.retiring: set[asyncio.Future[None]] = set()  # profiles a reload is stopping
        # With a loader (a pool): profiles that failed for good, (why, when they start again).
        self.failed: dict[str, tuple[str, float]] = {}
        self._retry_delay: dict[str, float] = {}
        self.monitors: dict[int, MonitorServer] = {}
        self.go_metrics: GoMetrics | None = None
        self.heartbeats: Heartbeats | None = None
        self._heartbeats_task: asyncio.Future[None] | None = None
        self._stopping = False
        self._finished: asyncio.Event | None = None  # set by stop() or by a profile failing for good
        self._failure: BaseException | None = None
        self._reload_now: asyncio.Event | None = None
        self._plan_go_metrics()

    # ---- what runs ----
    @property
    def profiles(self) -> list[Profile]:
        return [r.profile for r in self.running.values()]

    @property
    def replicators(self) -> list[Replicator]:
        return list(self.running.values())

    @property
    def ports(self) -> list[int]:
        if self.monitor_override is not None:
            return [self.monitor_override]
        return sorted({p.settings.monitor for p in self.profiles if p.settings.monitor is not None})

    def _replicator(self, profile: Profile) -> Replicator:
        return Replicator(profile, metrics=self.metrics, serve_monitor=False)

    def _plan_go_metrics(self) -> None:
        """The Go tool's families for a Go-format file or heartbeats, labelled for the profiles now."""
        if self.go_metrics is None and (self.config.dialect == "go" or self.config.heartbeats is not None):
            from replicator.observe.gometrics import GoMetrics

            self.go_metrics = GoMetrics(self.metrics.registry)
            self.go_metrics.add_source(self._stream_samples)
            self.go_metrics.add_source(self._heartbeat_samples)
        if self.go_metrics is not None:
            from replicator.observe.gometrics import GoStream

            self.go_metrics.streams = {
                p.metrics_name: GoStream(p.go.stream, p.go.replicator, p.go.name, p.durable_name)
                for p in self.profiles if p.go is not None}

    def readiness(self) -> tuple[bool, dict[str, object]]:
        workers: dict[str, object] = {}
        ready = not self.failed
        for r in self.replicators:
            ok, detail = r.readiness()
            ready = ready and ok
            part = detail.get("workers")
            if isinstance(part, dict):
                workers.update(part)
        failed = {name: why for name, (why, _retry_at) in self.failed.items()}
        return ready, {"workers": workers, **({"failed": failed} if failed else {})}

    def install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        if self.loader is not None:
            loop.add_signal_handler(signal.SIGHUP, self.reload_soon)

    def stop(self) -> None:
        self._stopping = True
        for r in self.replicators:
            r.stop()
        if self.heartbeats is not None:
            self.heartbeats.stop()
        if self._finished is not None:
            self._finished.set()

    def reload_soon(self) -> None:
        """SIGHUP: read the config file now, not at the next look."""
        if self._reload_now is not None:
            self._reload_now.set()

    @property
    def monitor_port(self) -> int | None:
        return next(iter(self.monitors.values())).port if self.monitors else None

    # ---- running ----
    async def run(self) -> None:
        log.info("%s", describe_build())
        self._finished, self._reload_now = asyncio.Event(), asyncio.Event()
        if self._stopping:
            self._finished.set()
        watcher: asyncio.Future[None] | None = None
        try:
            await self._follow_monitors()
            for name, replicator in self.running.items():
                self._launch(name, replicator)
            self._start_heartbeats()
            if self.loader is not None:
                watcher = asyncio.ensure_future(self._watch())
            await self._finished.wait()
        finally:
            # A profile failing for good (TLS, credentials) stops them all: a supervisor restarts the
            # process, and a half-running process would hide the problem.
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(BaseException):
                    await watcher
            self.stop()
            results = await asyncio.gather(*self.tasks.values(), *self.retiring, *self._heartbeat_tasks(),
                                           return_exceptions=True)
            for monitor in self.monitors.values():
                with contextlib.suppress(Exception):
                    await monitor.stop()
        failure = self._failure or next((r for r in results if isinstance(r, BaseException)), None)
        if failure is not None:
            raise failure

    def _launch(self, name: str, replicator: Replicator) -> None:
        task = asyncio.ensure_future(replicator.run())
        task.add_done_callback(self._ended)
        self.tasks[name] = task

    def _ended(self, task: asyncio.Future[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        name = next((n for n, t in self.tasks.items() if t is task), None)
        if self.loader is not None and name is not None and not self._stopping:
            self._failed_alone(name, task.exception())
            return
        if self._failure is None:
            self._failure = task.exception()
        if self._finished is not None:
            self._finished.set()

    def _failed_alone(self, name: str, err: BaseException | None) -> None:
        """A pool's profile failing for good (TLS, credentials) stops alone: the others go on, it
        is started again after a backoff (the files may be fixed meanwhile: a Secret updated) or
        at a reload that changes it, and `/readyz` names it until it runs."""
        self.tasks.pop(name, None)  # its error is told here, not again when the process stops
        delay = self._retry_delay.get(name, RETRY_FIRST)
        self._retry_delay[name] = min(delay * 2, RETRY_MAX)
        self.failed[name] = (str(err), time.monotonic() + delay)
        log.error("%s stopped: %s; the other profiles go on, it starts again in %.0f s (or at a reload that "
                  "changes it)", name, err, delay)

    def _retry_failed(self) -> None:
        now = time.monotonic()
        for name, (_why, retry_at) in list(self.failed.items()):
            if retry_at <= now and name in self.running and not self._stopping:
                del self.failed[name]
                replicator = self.running[name] = self._replicator(self.running[name].profile)
                self._launch(name, replicator)

    def _heartbeat_tasks(self) -> list[asyncio.Future[None]]:
        return [self._heartbeats_task] if self._heartbeats_task is not None else []

    def _start_heartbeats(self) -> None:
        if self.config.heartbeats is None or self._stopping:
            return
        from replicator.heartbeats import Heartbeats, heartbeat_profile

        name = site_name(self.config, self.profiles)
        self.heartbeats = Heartbeats(self.config.heartbeats, heartbeat_profile(self.config, name), name)
        self._heartbeats_task = asyncio.ensure_future(self.heartbeats.run())
        self._heartbeats_task.add_done_callback(self._ended)

    async def _stop_heartbeats(self) -> None:
        task, self._heartbeats_task = self._heartbeats_task, None
        if self.heartbeats is not None:
            self.heartbeats.stop()
        self.heartbeats = None
        if task is not None:
            with contextlib.suppress(Exception):
                await task

    async def _follow_monitors(self) -> None:
        """One monitor per port the profiles name (or `--monitor`): started, or stopped when none names it."""
        extra = self._go_render
        wanted = self.ports
        for port in [p for p in self.monitors if p not in wanted]:
            with contextlib.suppress(Exception):
                await self.monitors.pop(port).stop()
        for port in [p for p in wanted if p not in self.monitors]:
            monitor = MonitorServer(self.metrics.registry, self.readiness, port, extra=extra)
            await monitor.start()
            self.monitors[port] = monitor
            log.info("monitor on port %d: /metrics /healthz /readyz", monitor.port)

    def _go_render(self) -> bytes:
        return self.go_metrics.render() if self.go_metrics is not None else b""

    # ---- reloading ----
    async def _watch(self) -> None:
        assert self._reload_now is not None
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(WATCH_INTERVAL):
                    await self._reload_now.wait()
            asked = self._reload_now.is_set()
            self._reload_now.clear()
            changed = self.watch.changed() if self.watch is not None else False
            if (asked or changed) and not self._stopping:
                await self.reload()
            self._retry_failed()

    async def reload(self) -> bool:
        """Read the config file again and apply what changed; False (everything left running as it
        was) when the file does not load."""
        assert self.loader is not None
        try:
            config, profiles = self.loader()
        except ConfigError as err:
            log.error("config reload failed, still running the previous configuration: %s", err)
            self.metrics.reloaded(False)
            return False
        changes = plan({name: r.profile for name, r in self.running.items()}, profiles)
        heartbeats_changed = (config.heartbeats != self.config.heartbeats
                              or site_name(config, profiles) != site_name(self.config, self.profiles))
        if not changes.empty:
            log.info("config reloaded: %s", changes.describe({n: r.profile for n, r in self.running.items()}))
        await self.apply(config, changes, heartbeats_changed)
        self.metrics.reloaded(True)
        return True

    async def apply(self, config: Config, changes: Plan, heartbeats_changed: bool) -> None:
        """Stop what goes (all at once, each cleanly), then start what comes: a changed profile's
        new copy binds only after its old one has finished and let go of the consumer."""
        stopping = [(name, self.running.pop(name), self.tasks.pop(name, None)) for name in changes.stop]
        for name in changes.stop:  # removed, or changed: a new start, with a fresh backoff
            self.failed.pop(name, None)
            self._retry_delay.pop(name, None)
        for _name, replicator, _task in stopping:
            replicator.stop()
        if heartbeats_changed:
            await self._stop_heartbeats()
        for name, _replicator, task in stopping:
            if task is None:
                continue
            self.retiring.add(task)  # a stop of the process meanwhile still waits for its clean end
            task.add_done_callback(self.retiring.discard)
            try:
                await asyncio.shield(task)
            except Exception as err:  # one profile's failure must not stop the reload of the others
                log.warning("%s stopped with an error: %s", name, err)
            log.info("%s stopped for the reload", name)
        self.config = config
        if not self._stopping:
            for profile in changes.start:
                replicator = self.running[profile.profile] = self._replicator(profile)
                self._launch(profile.profile, replicator)
        live = {(r.profile.metrics_name, w.name) for r in self.running.values() for w in r.workers}
        for _name, replicator, _task in stopping:  # a changed profile's same workers keep their series
            for w in replicator.workers:
                if (replicator.profile.metrics_name, w.name) not in live:
                    self.metrics.forget(replicator.profile.metrics_name, w.name)
        if self._stopping:
            return
        self._plan_go_metrics()
        await self._follow_monitors()
        if heartbeats_changed:
            self._start_heartbeats()

    # ---- the Go tool's view ----
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

    def _heartbeat_samples(self) -> Iterable[Sample]:
        return self.heartbeats.samples() if self.heartbeats is not None else ()

