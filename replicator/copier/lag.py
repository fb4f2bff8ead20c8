"""The lag gauge while the copy waits.

Deliveries carry the consumer's pending count, and the copy loops set `stream_replicator_lag_msgs`
from it once per batch, at no cost beyond the delivery. While the copy waits for a target that is
down no delivery comes (ordered mode stops pulling when its window is full) or only redeliveries do
(scaled mode), and the gauge would freeze at its last value: the alerts on a growing lag could not
fire. So when copies are waiting and none has landed for `QUIET` seconds, the lag is read from the
source consumer's info instead (pending plus unacknowledged: the messages not yet copied), every
`QUIET` seconds until copies land again (and once more then). Nothing of this runs while copies land.
"""

from __future__ import annotations

import logging

from replicator.copier.endpoints import Endpoints, flush_counts
from replicator.transport.errors import NATS_ERRORS

log = logging.getLogger(__name__)

QUIET = 3.0  # seconds without a copy landing, while copies wait, before the consumer is asked
READ_TIMEOUT = 1.0  # the loop waits this long at most for a source that is unreachable too


class LagWatch:
    """Sets the lag gauge: from the deliveries (`flush`, once per batch), or from the consumer's
    info (`check`, about once a second) while the copy makes no progress. `stalled`: the gauge
    holds the consumer's count, which the deliveries' own (pending only, behind copies that cannot
    land) must not overwrite until copies land again."""

    def __init__(self, ep: Endpoints, consumer: str) -> None:
        self.ep = ep
        self.consumer = consumer
        self.progress = -1  # the loop's progress marker at the last check
        self.since = 0.0  # monotonic time the marker last moved
        self.read_at = 0.0
        self.stalled = False
        self.read = False  # the gauge holds a count read here, not 0, that no delivery has replaced
        self.zero = False  # read as 0 since the marker or a delivery last moved: nothing left to copy

    def flush(self, lag: str | None) -> None:
        """Per batch: the latest delivery's pending count (None: no delivery), and the limiter's counts."""
        if lag is not None and not self.stalled:
            self.read = self.zero = False
        flush_counts(self.ep, None if self.stalled else lag)

    async def check(self, now: float, progress: int, holding: bool, behind: bool) -> None:
        """`progress` grows as copies land (or are skipped); `holding`: copies wait (window, buffer
        or in flight); `behind`: the last delivery had messages behind it. A worker whose deliveries
        stopped (scaled mode: another worker took the rest) would report that, or a count read
        here, for ever: both are read again until a read says 0 or a delivery replaces them."""
        moved = progress != self.progress
        if moved:
            self.progress, self.since, self.stalled, self.zero = progress, now, False, False
            if not self.read:
                return
            # Copies land again, and the gauge holds what was read while they could not: read it
            # again now rather than wait for a delivery that may never come to this worker.
        elif not holding and (self.zero or not (behind or self.read)):
            return
        elif now - self.since < QUIET:
            return
        if now - self.read_at < QUIET:
            return
        self.read_at = now
        ep = self.ep
        try:
            info = await ep.source_js.consumer_info(ep.source_stream, self.consumer, timeout=READ_TIMEOUT)
        except NATS_ERRORS as err:  # the source unreachable too, or the consumer gone: the gauge keeps its value
            log.debug("%s cannot read consumer %s for its lag: %s", ep.worker, self.consumer, err)
            return
        lag = (info.num_pending or 0) + (info.num_ack_pending or 0)
        self.stalled, self.read, self.zero = not moved, lag != 0, lag == 0
        ep.metrics.lag_msgs.set(lag)
