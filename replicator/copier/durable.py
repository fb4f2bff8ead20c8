"""Ordered mode's durable consumer on the source: always (re)created at an explicit position.

The server's redelivery order cannot be trusted for messages that were in flight when a worker
died, so the ordered worker never resumes a durable as it stands: it deletes it and creates it
again right after what it knows has landed (`position.resume_point`), after what it holds, or,
at a clean stop, exactly at the copy position (so the next start needs no search of the target).
"""

from __future__ import annotations

import contextlib

from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from replicator.copier.endpoints import ACK_WAIT, Endpoints

WRITE_NOTE = "stream-replicator.write"  # how the target is written (`batching.py`), for `report`
OWNER_NOTE = "stream-replicator.owner"  # the replicator name: `report` lists durables no profile owns
# A durable deleted and created again at once by two clients can come back from nats-server with the
# old one's delivery state (seen with 2.15: start 71 asked, delivery from 31): creation is checked.
FRESH_ATTEMPTS = 5


class StaleDurable(RuntimeError):
    """The durable kept coming back with an old delivery state: placing it again later may succeed."""


def at(seq: int) -> dict[str, object]:
    """The consumer settings that start delivery at source sequence `seq`."""
    return {"deliver_policy": DeliverPolicy.BY_START_SEQUENCE, "opt_start_seq": seq}


async def place(ep: Endpoints, position: dict[str, object], max_in_flight: int, *, delete: bool = True,
                write_path: str | None = None) -> None:
    """Create the durable at `position` (`at(seq)`, or a first-start position), replacing it;
    `write_path` is noted in its metadata."""
    if delete:
        with contextlib.suppress(NotFoundError):
            await ep.source_js.delete_consumer(ep.source_stream, ep.profile.durable_name)
    if ep.profile.settings.ephemeral:  # as the Go tool makes it: R1, in memory, gone when unused
        position = {**position, "num_replicas": 1, "mem_storage": True, "inactive_threshold": 50.0}
    config = ConsumerConfig(
        durable_name=ep.profile.durable_name,
        ack_policy=AckPolicy.ALL,
        ack_wait=ACK_WAIT,
        max_ack_pending=max_in_flight * 2,
        filter_subject=ep.profile.settings.topic,
        max_waiting=512,
        metadata={OWNER_NOTE: ep.profile.base_name, **({WRITE_NOTE: write_path} if write_path else {}), **ep.notes},
        **position,  # type: ignore[arg-type]
    )
    for _ in range(FRESH_ATTEMPTS):
        info = await ep.source_js.add_consumer(ep.source_stream, config)
        if not info.delivered or not info.delivered.consumer_seq:
            return
        # Another process deleted and created this durable at the same moment, and the server handed
        # back one that still holds the old delivery state: delete it and create it again.
        with contextlib.suppress(NotFoundError):
            await ep.source_js.delete_consumer(ep.source_stream, ep.profile.durable_name)
    raise StaleDurable(f"durable {ep.profile.durable_name} kept an old delivery state after "
                       f"{FRESH_ATTEMPTS} attempts to create it afresh")


async def park(ep: Endpoints, committed: int, max_in_flight: int, write_path: str | None = None) -> None:
    """At a clean stop: recreate the durable at `committed + 1` when it holds delivered but
    unacknowledged messages (pulled, never published), which a restart would otherwise have to
    treat as uncertain and search the target for."""
    info = await ep.source_js.consumer_info(ep.source_stream, ep.profile.durable_name)
    if info.num_ack_pending:
        await place(ep, at(committed + 1), max_in_flight, write_path=write_path)
