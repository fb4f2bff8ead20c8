"""Blind spots: from when to when the replicator was not watching a topic, told to the centre.

While it was down, or far behind (an outage of the target, a long backlog), the replicator could
not tell which senders went quiet: the stream clock (`clock.py`) finds the span, and this module
publishes it as a `blind_spot` advisory through the advisor (its subject, retries and leader): from
the time of the newest message read while it kept up, to the time it caught up again. Fleet health
marks a node whose silence lies inside one `unknown`, not `timeout`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import logging
from typing import Any

from replicator.sampling.advisories import Advisor

log = logging.getLogger(__name__)

BLIND_SPOT_SCHEMA_ID = "https://stream-replicator.io/schemas/sr/v1/blind_spot_advisory.json"


def blind_spot_advisory(*, replicator: str, topic: str, since: float, until: float, now: float) -> dict[str, Any]:
    """The document; `event_id` is derived from (replicator, topic, from), so a retry names it the same."""
    raw = "\x1f".join((replicator, topic, "blind_spot", str(round(since * 1000))))
    return {
        "$schema": BLIND_SPOT_SCHEMA_ID,
        "event_id": hashlib.sha256(raw.encode()).hexdigest()[:32],
        "event": "blind_spot",
        "value": topic,
        "replicator": replicator,
        "topic": topic,
        "from": since,
        "until": until,
        "timestamp": int(now),
    }


class BlindSpots:
    """Hands the stream clock's blind spots to the advisor, on the leader only."""

    def __init__(self, advisor: Advisor) -> None:
        self.advisor = advisor
        self._tasks: set[asyncio.Task[None]] = set()

    def __call__(self, since: float, until: float) -> None:
        advisor = self.advisor
        log.warning("topic %s was not watched from %s to %s (%.1f s): silences inside are unknown, not timeouts",
                    advisor.topic, _iso(since), _iso(until), until - since)
        if not advisor.active:
            return
        doc = blind_spot_advisory(replicator=advisor.replicator, topic=advisor.topic, since=since, until=until,
                                  now=until)
        task = asyncio.ensure_future(self._publish(doc))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _publish(self, doc: dict[str, Any]) -> None:
        if await self.advisor.publish(doc):
            self.advisor.metrics.advisories_blind_spot.inc()
        else:
            self.advisor.metrics.advisories_errors.inc()


def _iso(when: float) -> str:
    return dt.datetime.fromtimestamp(when, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
