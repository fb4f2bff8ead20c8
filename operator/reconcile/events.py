"""Kubernetes Events about a resource: posted through kopf's poster (which names the resource as the
involved object and batches the writes) and logged, so that the operator says what it did even
where no kopf poster runs (unit tests, tools)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kopf
from replication_operator.reconcile.memory import Said

log = logging.getLogger("replication_operator")


class Events:
    """Posts Events about resources; the reconciler and the engine switch share one."""

    def post(self, body: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        try:
            kopf.event(body, type=kind, reason=reason, message=message)  # type: ignore[arg-type]
        except LookupError:  # outside an operator (unit tests, tools): log only
            pass
        level = logging.WARNING if kind == "Warning" else logging.INFO
        meta = body["metadata"]
        log.log(level, "%s/%s: %s: %s", meta.get("namespace"), meta.get("name"), reason, message)

    def warn_new(self, body: Mapping[str, Any], before: Said, now: Said) -> Said:
        """A Warning for each (reason, message) of `now` not posted `before`; returns `now`."""
        for reason, message in now:
            if (reason, message) not in before:
                self.post(body, "Warning", reason, message)
        return now
