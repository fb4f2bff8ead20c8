"""The native engine's mirror form, pure: when the resource creates its target stream, that stream
can be a *mirror* of the source rather than a stream with a source entry. A mirror keeps the
source's sequence numbers (consumers and tools on the target can use them) and copies faster; it
takes no other writer, which is why it is only chosen for a stream the resource creates.

Leaving the mirror form (the replicator takes over, or the spec changes what the mirror copies,
which NATS cannot change in a mirror) *promotes* it (NATS 2.12+): the mirror configuration goes,
the stream keeps its messages and their sequences, and gets subjects so others can write to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from replication_operator.engine import entry as native
from replication_operator.model.spec import ReplicationSpec

from replicator.transport.subjects import rewrite_subject

SOURCE = "source"
MIRROR = "mirror"
# Why a form runs (status.native.formReason).
CREATED_ALONE = "the resource created the target stream and is its only writer"
ASKED_SOURCE = "spec.native.form is source"
STREAM_EXISTED = "the target stream existed: other writers may use it"
PROMOTED = "promoted from a mirror: "


def form_for_new_stream(spec: ReplicationSpec) -> tuple[str, str]:
    """(form, why) for a target stream the resource is about to create."""
    if spec.native.form == SOURCE:
        return SOURCE, ASKED_SOURCE
    return MIRROR, CREATED_ALONE


def is_mirror(recorded: Mapping[str, Any]) -> bool:
    return recorded.get("form") == MIRROR


def mirror_config(source_config: Mapping[str, Any], spec: ReplicationSpec, name: str,
                  entry: Mapping[str, Any], source_stream: str) -> dict[str, Any]:
    """The target stream as a mirror: the replicator's `target_create` rules (native.target_config),
    no subjects of its own (a mirror takes none), and our entry as its `mirror`."""
    config = native.target_config(source_config, spec, name, entry, source_stream)
    config.pop("sources", None)
    config.pop("subjects", None)
    config["mirror"] = dict(entry)
    config["description"] = f"mirror of {source_stream} by stream-replicator (native engine)"
    return config


def live_mirror(config: Mapping[str, Any]) -> dict[str, Any] | None:
    mirror = config.get("mirror")
    return dict(mirror) if isinstance(mirror, Mapping) else None


def promoted(config: Mapping[str, Any], spec: ReplicationSpec | None) -> dict[str, Any]:
    """The stream's config after promotion: no mirror, and the subjects the replicator of `spec`
    writes (None: a source entry goes on, which needs none)."""
    result = {k: v for k, v in config.items() if k != "mirror"}
    if spec is not None:
        subject = rewrite_subject(spec.topic, spec.target.subject_prefix, spec.target.subject_remove)
        result["subjects"] = list(dict.fromkeys([*(config.get("subjects") or []), subject]))
    return result


def made_by_operator(config: Mapping[str, Any]) -> bool:
    """A mirror some StreamReplication created (see `mirror_config`): a second source may promote it."""
    description = str(config.get("description") or "")
    return description.startswith("mirror of ") and description.endswith("by stream-replicator (native engine)")


def existing_reason(spec: ReplicationSpec) -> str:
    """Why a stream that existed carries a source entry."""
    if spec.native.form == MIRROR:
        return "spec.native.form is mirror, but " + STREAM_EXISTED + " (a mirror needs a stream of its own)"
    return STREAM_EXISTED


def unfiltered(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The entry without a filter that takes the whole source stream anyway: NATS then mirrors
    without a filtered consumer, as a hand-made mirror does (measured: a filtered mirror of the
    same messages copies slower). A subject transform stays."""
    return {k: v for k, v in entry.items() if k != "filter_subject"}


def whole(recorded: Mapping[str, Any]) -> bool:
    """Whether the recorded mirror reads the whole source stream (no filter)."""
    return is_mirror(recorded) and list(recorded.get("filterSubjects") or []) == [native.ALL]
