"""The Argo CD health check (gitops/argocd/health.lua), run in a real Lua 5.1 (lupa), and kstatus's
reading (tests/support/kstatus.py) of the statuses the operator writes: every condition and reason,
each status built by the operator's own status builder, not written by hand."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from replication_operator.checks import policy
from replication_operator.engine import choice as engine
from replication_operator.engine import health
from replication_operator.model import naming
from replication_operator.model import status as st
from replication_operator.reconcile.status_writer import PERMANENT

from tests.support import kstatus

HEALTH_LUA = Path(__file__).resolve().parents[2] / "gitops" / "argocd" / "health.lua"
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
GEN = 4


def _lua() -> Any:
    try:
        import lupa.lua51 as lupa  # Argo CD runs gopher-lua: Lua 5.1
    except ImportError:  # a lupa wheel built without 5.1: the default runtime still runs this 5.1 code
        import lupa  # type: ignore[no-redef]
    return lupa.LuaRuntime(unpack_returned_tuples=True)


LUA = _lua()
SCRIPT = HEALTH_LUA.read_text()


def argocd_health(obj: dict[str, Any]) -> tuple[str, str]:
    """What Argo CD shows: the script sees the resource as the global `obj`, as in Argo CD."""
    LUA.globals().obj = LUA.table_from(obj, recursive=True)
    result = LUA.execute(SCRIPT)
    return str(result["status"]), str(result["message"])


def deployment(desired: int, *, updated: int, ready: int, observed: bool = True, reason: str = "") -> dict[str, Any]:
    conditions = [{"type": "Progressing", "status": "True", "reason": reason, "message": "deadline"}] if reason else []
    return {"metadata": {"generation": 2}, "spec": {"replicas": desired},
            "status": {"observedGeneration": 2 if observed else 1, "replicas": max(updated, ready),
                       "updatedReplicas": updated, "readyReplicas": ready, "conditions": conditions}}


def resource(status: dict[str, Any], generation: int = GEN,
             annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": naming.API_VERSION, "kind": naming.KIND,
            "metadata": {"name": "cmdb", "namespace": "ns", "generation": generation,
                         "annotations": annotations or {}},
            "status": status}


def built(problems: tuple[tuple[str, str], ...] = (), dep: dict[str, Any] | None = None, desired: int = 1,
          native: st.Native | None = None, choice: engine.Choice | None = None,
          certificate: dict[str, Any] | None = None, loop: str | None = None) -> dict[str, Any]:
    extra = [engine.condition(choice, GEN)] if choice else []
    extra += [c for c in [st.loop_condition(loop, GEN)] if c is not None]
    return st.build_status(name="cmdb", generation=GEN, problems=[st.Problem(r, m) for r, m in problems],
                           deployment=dep, desired_replicas=desired, old_status=None, now=NOW, native=native,
                           extra_conditions=extra, certificates=certificate, permanent=PERMANENT)


def cert(days: float) -> dict[str, Any] | None:
    when = None if days != days else NOW + dt.timedelta(days=days)  # NaN: unreadable
    return st.certificate_condition([st.MountedCertificate('secret "tls" key "tls.crt"', "CN=sr", when)], NOW,
                                    dt.timedelta(days=14), GEN)


HEALTHY_DEP = deployment(1, updated=1, ready=1, reason="NewReplicaSetAvailable")
ENTRY = dict(configured=True, stream="COPY", source="CMDB")
REQUESTED = engine.Choice(engine.REPLICATOR, engine.REQUESTED, "spec.engine")

# Degraded reasons: permanent ones make Stalled True (kstatus Failed), the others are retried.
PERMANENT_REASONS = sorted(PERMANENT)
RETRIED_REASONS = [st.APPLY_FAILED, engine.NATIVE_UNAVAILABLE, engine.SOURCE_ENTRY_FAILED, engine.HANDOVER_FAILED]

# (case, status builder, Argo CD health, kstatus status)
CASES: list[tuple[str, Callable[[], dict[str, Any]], str, str]] = [
    *[(f"stalled-{r}", (lambda r=r: built(((r, f"{r} happened"),))), "Degraded", kstatus.FAILED)
      for r in PERMANENT_REASONS if r != st.ROLLOUT_STUCK],
    *[(f"retried-{r}", (lambda r=r: built(((r, f"{r} happened"),))), "Degraded", kstatus.IN_PROGRESS)
      for r in RETRIED_REASONS],
    ("creating", lambda: built(), "Progressing", kstatus.IN_PROGRESS),
    ("pool-handover", lambda: built(((st.POOL_HANDOVER, "waiting 60 s more for pool 'region''s workers"),)),
     "Progressing", kstatus.IN_PROGRESS),
    ("rolling-out", lambda: built(dep=deployment(2, updated=1, ready=1), desired=2), "Progressing",
     kstatus.IN_PROGRESS),
    ("pods-not-ready", lambda: built(dep=deployment(1, updated=1, ready=0)), "Progressing", kstatus.IN_PROGRESS),
    ("replicating", lambda: built(dep=HEALTHY_DEP, choice=REQUESTED), "Healthy", kstatus.CURRENT),
    ("scaled-to-zero", lambda: built(dep=deployment(0, updated=0, ready=0, reason="NewReplicaSetAvailable"),
                                     desired=0), "Healthy", kstatus.CURRENT),
    ("rollout-stuck", lambda: built(dep=deployment(1, updated=1, ready=0, reason="ProgressDeadlineExceeded")),
     "Degraded", kstatus.FAILED),
    ("pods-unavailable", lambda: built(dep=deployment(2, updated=2, ready=1, reason="NewReplicaSetAvailable"),
                                       desired=2),
     "Degraded", kstatus.IN_PROGRESS),
    ("native-stopping-replicator", lambda: built(native=st.Native(stopping=True)), "Progressing",
     kstatus.IN_PROGRESS),
    ("native-creating", lambda: built(native=st.Native(stream="COPY")), "Progressing", kstatus.IN_PROGRESS),
    ("native-sourcing", lambda: built(native=st.Native(**ENTRY),
                                      choice=engine.Choice(engine.NATIVE, engine.SOURCE_REACHABLE, "probe")),
     "Healthy", kstatus.CURRENT),
    ("native-mirror-recreated", lambda: built(native=st.Native(**ENTRY, mirror=True, recreated="at 12:00")),
     "Healthy", kstatus.CURRENT),
    ("native-source-error", lambda: built(native=st.Native(**ENTRY, error="no route")), "Degraded",
     kstatus.IN_PROGRESS),
    ("native-lagging", lambda: built(native=st.Native(**ENTRY, unready=(health.LAGGING, "900 behind"))),
     "Progressing", kstatus.IN_PROGRESS),
    ("native-connecting", lambda: built(native=st.Native(**ENTRY, unready=(health.CONNECTING, "not yet"))),
     "Progressing", kstatus.IN_PROGRESS),
    ("native-inactive", lambda: built(native=st.Native(**ENTRY, unready=(health.SOURCE_INACTIVE, "silent"),
                                                       degrading=True)), "Degraded", kstatus.IN_PROGRESS),
    *[(f"engine-{r}", (lambda r=r: built(dep=HEALTHY_DEP, choice=engine.Choice(engine.REPLICATOR, r, "why"))),
       "Healthy", kstatus.CURRENT)
      for r in (engine.NEEDS_REPLICATOR, engine.NO_ROUTE, engine.SOURCE_UNREACHABLE)],
    ("loop-refused", lambda: built(dep=HEALTHY_DEP, loop="consumer note: copy loop refused"), "Degraded",
     kstatus.FAILED),
    ("loops-skipped", lambda: built(dep=HEALTHY_DEP, loop="active-active: 3 looping copies skipped"), "Healthy",
     kstatus.CURRENT),
    ("no-loop", lambda: built(dep=HEALTHY_DEP, loop=""), "Healthy", kstatus.CURRENT),
    ("certificates-valid", lambda: built(dep=HEALTHY_DEP, certificate=cert(90)), "Healthy", kstatus.CURRENT),
    ("certificate-expiring", lambda: built(dep=HEALTHY_DEP, certificate=cert(3)), "Healthy", kstatus.CURRENT),
    ("certificate-expired", lambda: built(dep=HEALTHY_DEP, certificate=cert(-1)), "Degraded", kstatus.CURRENT),
    ("certificate-unreadable", lambda: built(dep=HEALTHY_DEP, certificate=cert(float("nan"))), "Degraded",
     kstatus.CURRENT),
]


@pytest.mark.parametrize(("status_of", "argo", "flux"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_health_of_every_status_the_operator_writes(status_of: Callable[[], dict[str, Any]], argo: str,
                                                     flux: str) -> None:
    obj = resource(status_of())
    health_status, message = argocd_health(obj)
    assert health_status == argo, message
    assert message  # Argo CD shows it beside the health
    assert kstatus.compute(obj)[0] == flux
    kinds = {c["type"]: c["status"] for c in obj["status"]["conditions"]}
    assert kinds[st.PROGRESSING] in ("True", "False") and kinds[st.DEGRADED] in ("True", "False")
    # Never both: kstatus would read whichever comes first.
    assert not (kinds[st.RECONCILING] == "True" and kinds[st.STALLED] == "True")


def test_the_cases_cover_every_condition_and_reason() -> None:
    """A reason added to the operator without a case here fails this test."""
    seen: set[tuple[str, str]] = set()
    for _, status_of, _, _ in CASES:
        seen |= {(c["type"], c["reason"]) for c in status_of()["conditions"]}
    seen |= {(c["type"], c["reason"]) for c in paused()["status"]["conditions"]}
    reasons = {r for _, r in seen}
    types = {t for t, _ in seen}
    assert types == {st.READY, st.PROGRESSING, st.DEGRADED, st.RECONCILING, st.STALLED, st.PAUSED,
                     st.CERTIFICATES_EXPIRING, engine.CONDITION, st.SOURCE_RECREATED, st.COPY_LOOP}
    condition_types = {st.READY, st.PROGRESSING, st.DEGRADED, st.RECONCILING, st.STALLED, st.PAUSED,
                       st.CERTIFICATES_EXPIRING, st.SOURCE_RECREATED, st.COPY_LOOP}
    written = {v for k, v in vars(st).items() if k.isupper() and isinstance(v, str) and v[:1].isupper()
               and v not in condition_types}
    written |= set(policy.REASONS) | {health.SOURCE_INACTIVE, health.CONNECTING, health.LAGGING}
    written |= {v for k, v in vars(engine).items() if k.isupper() and isinstance(v, str) and v[:1].isupper()
                and v != engine.CONDITION}
    assert written - reasons == set()


def paused(generation: int = GEN) -> dict[str, Any]:
    before = built(dep=HEALTHY_DEP)
    conditions = st.paused_conditions(before["conditions"], naming.PAUSED_ANNOTATION, NOW)
    return resource({**before, "conditions": conditions}, generation, {naming.PAUSED_ANNOTATION: "true"})


def test_paused_is_suspended_even_with_an_unobserved_spec() -> None:
    assert argocd_health(paused())[0] == "Suspended"
    assert argocd_health(paused(GEN + 1))[0] == "Suspended"
    assert naming.PAUSED_ANNOTATION in argocd_health(paused())[1]
    # kstatus has no paused state: a spec edited while paused is not applied, so not Current.
    assert kstatus.compute(paused())[0] == kstatus.CURRENT
    assert kstatus.compute(paused(GEN + 1))[0] == kstatus.IN_PROGRESS


def test_no_status_yet_and_an_unobserved_generation_are_progressing() -> None:
    assert argocd_health(resource({})) == ("Progressing", "Waiting for the operator to report status")
    obj = resource(built(dep=HEALTHY_DEP), generation=GEN + 1)
    assert argocd_health(obj)[0] == "Progressing"
    assert kstatus.compute(obj)[0] == kstatus.IN_PROGRESS


def test_a_false_condition_is_not_a_failure() -> None:
    """NACK's check marks any False condition Degraded; healthy here has Progressing and Degraded False."""
    obj = resource(built(dep=HEALTHY_DEP))
    falses = {c["type"] for c in obj["status"]["conditions"] if c["status"] == "False"}
    assert {st.PROGRESSING, st.DEGRADED, st.RECONCILING, st.STALLED} <= falses
    assert argocd_health(obj)[0] == "Healthy"


def test_the_argocd_cm_patch_ships_the_tested_script() -> None:
    """What docs/gitops.md tells users to apply is the script these tests run."""
    import yaml

    patch = yaml.safe_load((HEALTH_LUA.parent / "argocd-cm.patch.yaml").read_text())
    key = "resource.customizations.health.streamreplicator.io_StreamReplication"
    assert patch == {"data": {key: SCRIPT}}
    assert key in (HEALTH_LUA.parents[2] / "docs" / "gitops.md").read_text()
