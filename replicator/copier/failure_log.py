"""What the ordered copier's failed publishes tell the operator: each one counted and logged at the
level it deserves, and a target that refuses every message (full, sealed) shown by the
`target_blocked` gauge and logged once when that starts and once when it ends, not per retry."""

from __future__ import annotations

import logging
import time

from replicator.copier.endpoints import Endpoints
from replicator.copier.failures import Failure
from replicator.copier.poison import describe
from replicator.transport.jetstream import PublishError

log = logging.getLogger(__name__)


class FailureLog:
    def __init__(self, ep: Endpoints) -> None:
        self.ep = ep
        self.blocked_since: float | None = None

    def failed(self, seq: int, attempts: int, err: PublishError, kind: Failure) -> None:
        """The publish of source sequence `seq` failed for the `attempts`th time."""
        ep, m = self.ep, self.ep.metrics
        if kind is Failure.CHAIN:
            m.chain_restarts.inc()
            log.debug("%s chain broken at source sequence %d: %s", ep.worker, seq, err.description)
            return
        m.failed_msgs.inc()
        if kind is Failure.BLOCKED:
            if self.blocked_since is None:
                self.blocked_since = time.monotonic()
                m.target_blocked.set(1)
                log.warning("%s target stream %s refuses messages (%s): backing off until there is room",
                            ep.worker, ep.target_stream, err.description)
        elif kind is Failure.PERMANENT:
            log.debug("%s source sequence %d refused (attempt %d): %s", ep.worker, seq, attempts, describe(err))
        else:
            log.warning("%s publish of source sequence %d failed: %s", ep.worker, seq, describe(err))

    def landed(self) -> None:
        """Copies landed: a refusing target takes messages again."""
        if self.blocked_since is not None:
            log.info("%s target accepts messages again", self.ep.worker)
            self.blocked_since = None
            self.ep.metrics.target_blocked.set(0)
