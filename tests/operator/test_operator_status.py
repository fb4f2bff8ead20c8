"""Status conditions from problems and the Deployment's status (pure)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from replication_operator.model import status as st

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
T1 = T0 + dt.timedelta(minutes=5)


def _deployment(
    replicas: int = 2,
    ready: int = 2,
    updated: int = 2,
    observed: bool = True,
    progressing: str | None = "NewReplicaSetAvailable",
    message: str = "",
) -> dict[str, Any]:
    conditions = [{"type": "Progressing", "status": "True", "reason": progressing, "message": message}]
    return {
        "metadata": {"generation": 3},
        "status": {
            "observedGeneration": 3 if observed else 2,
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": updated,
            "conditions": conditions if progressing else [],
        },
    }


def _by_type(conditions: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in conditions}


def test_creating() -> None:
    conds = _by_type(st.conditions_for([], st.rollout_of(None, 1), 1))
    assert conds == {
        "Ready": ("False", "Creating"),
        "Progressing": ("True", "Creating"),
        "Degraded": ("False", "Healthy"),
    }


def test_rolled_out_and_ready() -> None:
    conds = _by_type(st.conditions_for([], st.rollout_of(_deployment(), 2), 4))
    assert conds == {
        "Ready": ("True", "Replicating"),
        "Progressing": ("False", "RolloutComplete"),
        "Degraded": ("False", "Healthy"),
    }


def test_rolling_out_with_the_old_pods_still_serving() -> None:
    deployment = _deployment(replicas=3, ready=2, updated=1, progressing="ReplicaSetUpdated")
    conds = _by_type(st.conditions_for([], st.rollout_of(deployment, 2), 4))
    assert conds["Ready"] == ("True", "Replicating")
    assert conds["Progressing"] == ("True", "RollingOut")
    assert conds["Degraded"] == ("False", "Healthy")


def test_not_yet_observed_by_the_deployment_controller() -> None:
    conds = _by_type(st.conditions_for([], st.rollout_of(_deployment(observed=False), 2), 4))
    assert conds["Progressing"] == ("True", "RollingOut")


def test_problems_block_and_degrade() -> None:
    problems = [
        st.Problem(st.SECRET_MISSING, 'secret "nats-creds" (key "user.creds") not found in namespace "x"')
    ]
    conditions = st.conditions_for(problems, st.rollout_of(_deployment(), 2), 4)
    by_type = {c["type"]: c for c in conditions}
    assert (by_type["Degraded"]["status"], by_type["Degraded"]["reason"]) == ("True", "SecretMissing")
    assert "nats-creds" in by_type["Degraded"]["message"]
    assert by_type["Ready"]["reason"] == "SecretMissing"
    assert "2 pods of the previous configuration" in by_type["Ready"]["message"]
    assert (by_type["Progressing"]["status"], by_type["Progressing"]["reason"]) == ("False", "Blocked")


def test_stuck_rollout() -> None:
    deployment = _deployment(
        ready=0,
        updated=1,
        progressing="ProgressDeadlineExceeded",
        message='ReplicaSet "x" has timed out progressing.',
    )
    conds = _by_type(st.conditions_for([], st.rollout_of(deployment, 2), 4))
    assert conds["Degraded"] == ("True", "RolloutStuck")
    assert conds["Progressing"] == ("False", "RolloutStuck")
    assert conds["Ready"] == ("False", "PodsNotReady")


def test_pods_lost_after_a_complete_rollout() -> None:
    conds = _by_type(st.conditions_for([], st.rollout_of(_deployment(ready=1), 2), 4))
    assert conds["Degraded"] == ("True", "PodsUnavailable")
    assert conds["Ready"] == ("True", "Replicating")


def test_scaled_to_zero() -> None:
    conds = _by_type(st.conditions_for([], st.rollout_of(_deployment(replicas=0, ready=0, updated=0), 0), 4))
    assert conds["Ready"] == ("True", "ScaledToZero")
    assert conds["Progressing"] == ("False", "RolloutComplete")


def test_transition_time_moves_only_on_a_flip() -> None:
    first = st.merge_conditions(None, st.conditions_for([], st.rollout_of(None, 1), 1), T0)
    starting = _deployment(1, 0, 1, progressing="ReplicaSetUpdated")
    same = st.merge_conditions(first, st.conditions_for([], st.rollout_of(starting, 1), 1), T1)
    ready = st.merge_conditions(same, st.conditions_for([], st.rollout_of(_deployment(1, 1, 1), 1), 1), T1)
    times = {c["type"]: c["lastTransitionTime"] for c in same}
    assert times == {
        "Ready": "2026-01-01T12:00:00Z",
        "Progressing": "2026-01-01T12:00:00Z",
        "Degraded": "2026-01-01T12:00:00Z",
    }
    assert {c["type"]: c["reason"] for c in same}["Ready"] == "PodsNotReady"  # reason moved, time did not
    flipped = {c["type"]: c["lastTransitionTime"] for c in ready}
    assert flipped["Ready"] == "2026-01-01T12:05:00Z"
    assert flipped["Degraded"] == "2026-01-01T12:00:00Z"


def _orders(old_status: dict[str, Any] | None, now: dt.datetime) -> dict[str, Any]:
    """The status of a healthy `orders` at generation 4, both of its 2 replicas ready."""
    return st.build_status(name="orders", generation=4, problems=[], deployment=_deployment(), desired_replicas=2,
                           old_status=old_status, now=now)


def test_build_status_and_patch() -> None:
    status = _orders(None, T0)
    assert status["observedGeneration"] == 4
    assert (status["replicas"], status["readyReplicas"]) == (2, 2)
    assert status["selector"] == "app.kubernetes.io/instance=orders,app.kubernetes.io/name=stream-replicator"
    assert all(c["observedGeneration"] == 4 for c in status["conditions"])
    again = _orders(status, T1)
    assert st.status_patch(status, again) == {}
    assert st.status_patch({**status, "lag": 5}, {"lag": 7}) == {"lag": 7}


def test_the_memory_derives_the_status_a_pass_starts_from_and_what_is_asked() -> None:
    """One place for both (reconcile/memory.py): the status this process wrote, else the resource's;
    the replicas and fleet-health schedule asked for, from the typed spec or, when it cannot be read,
    the raw fields (status and metrics still say what was asked while the resource is Degraded)."""
    from replication_operator.reconcile.memory import Asked, Memory, asked

    from tests.operator import helpers as h

    body = h.example("cmdb-city1") | {"status": {"engine": "replicator"}}
    memory = Memory()
    assert memory.current_status(body) == {"engine": "replicator"}
    memory.status = {"engine": "native"}
    assert memory.current_status(body) == {"engine": "native"}
    assert asked(body) == Asked(replicas=body["spec"].get("replicas", 1), fleet_schedule=None)
    broken = {**body, "spec": {**body["spec"], "mode": "parallel", "replicas": 4, "fleetHealth": {"output": "/x"}}}
    assert asked(broken) == Asked(replicas=4, fleet_schedule="")
