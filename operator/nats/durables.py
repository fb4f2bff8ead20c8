"""The replicator's durable consumer on the source, deleted when it is no longer wanted: on
interest or work-queue retention a durable nobody reads holds the stream's messages for ever."""

from __future__ import annotations

from nats.js.errors import NotFoundError
from replication_operator.model.spec import ReplicationSpec
from replication_operator.nats.connection import Auth, NatsStatusError, describe, jetstream_on

from replicator.transport.errors import NATS_ERRORS


async def delete_durable(spec: ReplicationSpec, consumer: str, auth: Auth, time_limit: float) -> str | None:
    """Delete `consumer` on the source stream; what was deleted (None: there was nothing to delete).
    Raises NatsStatusError when the source cannot be reached or refuses."""
    async with jetstream_on(spec.source.url, auth, time_limit) as js:
        stream = spec.source.stream
        try:
            stream = stream or await js.find_stream_name_by_subject(spec.topic)
            await js.delete_consumer(stream, consumer)
        except NotFoundError:
            return None  # no stream, or no such consumer: nothing left behind
        except NATS_ERRORS as err:
            raise NatsStatusError(f"cannot delete consumer {consumer}: {describe(err)}") from None
        return f"durable consumer {consumer} on source stream {stream}"
