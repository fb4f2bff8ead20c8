"""Heartbeats, as the Go Stream Replicator 0.8 sends them: a JetStream publish per configured subject
every interval, the unix time as body, `Choria-SR-Originator` (this host) and `Choria-SR-Subject`
headers plus the configured ones (a subject's own headers win over the shared ones).

Published into a stream that is itself replicated, a heartbeat measures the whole path even when
the fleet is quiet (`nats server check message --body-timestamp`). With `leader_election`, only
the elected process of the group publishes, on the key `SR_<replicator>_HB`, as the Go tool does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
import socket
import time
from collections.abc import Iterable

import nats.errors
import nats.js.errors
from nats.aio.client import Client

from replicator.config.model import Config, HeartbeatsConfig, Profile, TopicConfig, redact_url
from replicator.observe.gometrics import Sample
from replicator.sampling.election import LeaderElection, election_bucket, election_key
from replicator.transport.connections import connect
from replicator.transport.tasks import cancel_and_wait

log = logging.getLogger(__name__)

ORIGINATOR = "Choria-SR-Originator"
SUBJECT = "Choria-SR-Subject"
PUBLISH_TIMEOUT = 2.0
ELECTION_TTL = 10.0


def heartbeat_profile(config: Config, replicator: str) -> Profile:
    """The heartbeat connection as a one-sided profile, so it connects (TLS, credentials, URL
    options, reconnects) exactly like a copier's source side; its base name is the election key."""
    hb = config.heartbeats
    assert hb is not None
    name = "SR_" + re.sub(r"[^A-Za-z0-9_-]", "_", replicator) + "_HB"
    side: dict[str, object] = {"source_credentials": hb.credentials, "source_jwt_file": hb.jwt_file,
                               "source_seed_file": hb.seed_file, "source_user_file": hb.user_file,
                               "source_password_file": hb.password_file, "source_nkey_file": hb.nkey_file,
                               "source_token_file": hb.token_file, "source_tls": hb.tls,
                               "leader_election_bucket": hb.leader_election_bucket}
    topic = TopicConfig(topic=">", source_url=hb.url, target_url=hb.url, name=name,
                        **{k: v for k, v in side.items() if v is not None})  # type: ignore[arg-type]
    return Profile(Config(topics={"heartbeats": topic}), "heartbeats", source="heartbeats")


class Heartbeats:
    """Runs until `stop()`: one task per subject, an optional election, counters for the metrics."""

    def __init__(self, config: HeartbeatsConfig, profile: Profile, replicator: str, *,
                 hostname: str | None = None) -> None:
        self.config = config
        self.profile = profile
        self.replicator = replicator
        self.hostname = hostname or socket.gethostname()
        self.nc: Client | None = None
        self.election: LeaderElection | None = None
        self.paused = config.leader_election
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.published: dict[str, int] = {s.subject: 0 for s in config.subjects}
        self.errors: dict[str, int] = {s.subject: 0 for s in config.subjects}
        self.publish_time: dict[str, list[float]] = {s.subject: [0.0, 0.0] for s in config.subjects}  # sum, n

    def headers_for(self, subject: str, own: dict[str, str]) -> dict[str, str]:
        headers = {**self.config.headers, **own}
        headers[ORIGINATOR] = self.hostname
        headers[SUBJECT] = subject
        return headers

    async def run(self) -> None:
        try:
            self.nc = await connect(self.profile, "source", f"{self.profile.base_name}_{self.hostname}",
                                    stopping=lambda: self._stop.is_set())
        except Exception:  # a connect cut short by stop() fails with whatever it was doing: no error then
            if self._stop.is_set():
                return
            raise
        try:
            if self.config.leader_election:
                settings = self.profile.settings
                self.election = LeaderElection(
                    self.nc.jetstream(), settings.leader_election_bucket or election_bucket(ELECTION_TTL),
                    election_key(self.profile), self.hostname, ELECTION_TTL, None,
                    adopt_ttl=bool(settings.leader_election_bucket))
                self.election.on_change(self._leadership)
                await self.election.start()
            js = self.nc.jetstream()
            for s in self.config.subjects:
                interval = s.interval or self.config.interval
                headers = self.headers_for(s.subject, s.headers)
                self._tasks.append(asyncio.create_task(self._beat(js, s.subject, interval, headers),
                                                       name=f"heartbeat-{s.subject}"))
            log.info("heartbeats to %s on %d subject(s)%s", redact_url(self.profile.url_options("source").servers[0]),
                     len(self._tasks), " under leader election" if self.election else "")
            await self._stop.wait()
        finally:
            await cancel_and_wait(self._tasks)
            if self.election is not None:
                with contextlib.suppress(Exception):
                    await self.election.stop()
            if not self.nc.is_closed:
                with contextlib.suppress(Exception):
                    await self.nc.drain()

    def stop(self) -> None:
        self._stop.set()

    def _leadership(self, leader: bool) -> None:
        self.paused = not leader
        log.warning("heartbeats: %s %s", self.hostname, "became the leader" if leader else "lost the leadership")

    async def _beat(self, js: nats.js.JetStreamContext, subject: str, interval: float,
                    headers: dict[str, str]) -> None:
        # A splay, so a fleet of replicators started together does not beat in step.
        await asyncio.sleep(random.random() * min(interval, 5.0))
        while not self._stop.is_set():
            if not self.paused:
                started = time.monotonic()
                try:
                    await js.publish(subject, str(int(time.time())).encode(), headers=headers,
                                     timeout=PUBLISH_TIMEOUT)
                    self.published[subject] += 1
                except (nats.errors.Error, nats.js.errors.Error, TimeoutError, OSError) as err:
                    self.errors[subject] += 1
                    log.error("heartbeat to %s not published: %s", subject, err)
                took = self.publish_time[subject]
                took[0] += time.monotonic() - started
                took[1] += 1
            await asyncio.sleep(interval)

    def samples(self) -> Iterable[Sample]:
        """The Go tool's heartbeat (and heartbeat election) metrics."""
        r = self.replicator
        yield "heartbeat_subjects_count", {"replicator": r}, float(len(self._tasks))
        yield "heartbeat_paused", {"replicator": r, "hostname": self.hostname}, 1.0 if self.paused else 0.0
        for subject in self.published:
            labels = {"replicator": r, "subject": subject}
            yield "heartbeat_published_count", labels, float(self.published[subject])
            yield "heartbeat_published_error_count", labels, float(self.errors[subject])
            total, count = self.publish_time[subject]
            yield "heartbeat_publish_time_sum", labels, total
            yield "heartbeat_publish_time_count", labels, count
        if self.election is not None:
            yield from self.election.samples(self.hostname, r)

