"""A faithful re-statement, in Python, of kstatus's rules for a custom resource: what Flux's
health checks and `flux ... --wait` (and kpt, `kubectl` plugins on cli-utils) conclude from it.

Restated from cli-utils `pkg/kstatus/status/generic.go` (`checkGenericProperties`, `checkGeneration`,
read in its source): a custom resource has no type-specific rules, so only these apply, in this
order. The last rule, the `Ready` condition (True: Current, else InProgress), is how Flux reads it
(its documentation, and the behaviour issue 37 describes: `Ready=False` is "in progress"); the
fluxcd/cli-utils source of that rule was not at hand to read line by line. It is not kstatus
itself: it tells what a kstatus reader concludes, so that a test can assert it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CURRENT = "Current"
IN_PROGRESS = "InProgress"
FAILED = "Failed"
TERMINATING = "Terminating"


def compute(obj: Mapping[str, Any]) -> tuple[str, str]:
    """(status, message) as kstatus computes them for a custom resource."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    if meta.get("deletionTimestamp"):
        return TERMINATING, "Resource scheduled for deletion"
    generation = meta.get("generation")
    observed = status.get("observedGeneration")
    # checkGeneration: only when both are set.
    if generation is not None and observed is not None and observed != generation:
        return IN_PROGRESS, (f"{obj.get('kind')} generation is {generation}, but latest observed "
                             f"generation is {observed}")
    conditions = status.get("conditions") or []
    # In the order they are listed: the first Reconciling or Stalled that is True decides.
    for cond in conditions:
        if cond.get("type") == "Reconciling" and cond.get("status") == "True":
            return IN_PROGRESS, str(cond.get("message") or "")
        if cond.get("type") == "Stalled" and cond.get("status") == "True":
            return FAILED, str(cond.get("message") or "")
    for cond in conditions:
        if cond.get("type") == "Ready":
            return (CURRENT if cond.get("status") == "True" else IN_PROGRESS), str(cond.get("message") or "")
    return CURRENT, "Resource is current"
