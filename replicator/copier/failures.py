"""Every way a publish to the target can fail, classified: retry, back off, or give the message up.

The codes are JetStream's `err_code`s that a publish can return (nats-server 2.15.1, `errors.json`).
Anything else, a code this release does not know (a newer server) or an unexplained reply, is
`UNKNOWN`: retried like a transient failure for `UNKNOWN_GRACE` seconds, then reported as stuck
(metric, `/readyz`, `report`) while it keeps being retried; it is never dropped unexplained.
"""

from __future__ import annotations

from enum import StrEnum

from replicator.transport.jetstream import PublishError


class Failure(StrEnum):
    CHAIN = "chain"  # our own predecessor check failed: nothing from here on landed; re-send at once
    TRANSIENT = "transient"  # heals by itself (leader election, restart, overload): back off, retry
    BLOCKED = "blocked"  # the target refuses every message until an operator acts (full, sealed, no JetStream)
    POLICY = "policy"  # the target's features changed under us: re-read them, rebuild the headers, retry
    PERMANENT = "permanent"  # this message can never be stored there: poison (dead-letter or skip)
    UNKNOWN = "unknown"  # not classified: transient for UNKNOWN_GRACE, then reported stuck


UNKNOWN_GRACE = 60.0

# err_code -> (class, why); the manual's table is generated from the same facts.
CODES: dict[int, tuple[Failure, str]] = {
    # our own chain and publish conditions (ordered mode; batch modes)
    10070: (Failure.CHAIN, "wrong last msg ID: another writer wrote in between, or the predecessor did not land"),
    10071: (Failure.CHAIN, "wrong last sequence"),
    10164: (Failure.CHAIN, "wrong last sequence"),
    # heals by itself
    10008: (Failure.TRANSIENT, "JetStream system temporarily unavailable"),
    10009: (Failure.TRANSIENT, "JetStream cluster can not handle request (not leader)"),
    10063: (Failure.TRANSIENT, "expected stream sequence does not match (replication catching up)"),
    10118: (Failure.TRANSIENT, "stream is offline"),
    10194: (Failure.TRANSIENT, "stream is offline"),
    10158: (Failure.TRANSIENT, "duplicate message id is in process"),
    10163: (Failure.TRANSIENT, "expected last sequence per subject temporarily unavailable"),
    10167: (Failure.TRANSIENT, "too many requests"),
    10208: (Failure.TRANSIENT, "batch publish ID unknown (batch expired or server restarted)"),
    10210: (Failure.TRANSIENT, "atomic publish too many inflight"),
    10211: (Failure.TRANSIENT, "batch publish too many inflight"),
    # the target refuses everything until someone acts
    10002: (Failure.BLOCKED, "resource limits exceeded for account"),
    10023: (Failure.BLOCKED, "insufficient resources"),
    10028: (Failure.BLOCKED, "insufficient memory resources available"),
    10047: (Failure.BLOCKED, "insufficient storage resources available"),
    10039: (Failure.BLOCKED, "JetStream not enabled for account"),
    10076: (Failure.BLOCKED, "JetStream not enabled"),
    10109: (Failure.BLOCKED, "invalid operation on sealed stream"),
    10120: (Failure.BLOCKED, "no JetStream default or applicable tiered limit present"),
    10077: (Failure.BLOCKED, "store failed: stream full (discard new); 'message too large' is permanent"),
    # the target's features changed since they were read
    10111: (Failure.POLICY, "rollup not permitted"),
    10166: (Failure.POLICY, "per-message TTL is disabled"),
    10168: (Failure.POLICY, "message counters is disabled"),
    # this message can never be stored on that target
    10003: (Failure.PERMANENT, "bad request"),
    10054: (Failure.PERMANENT, "message size exceeds maximum allowed"),
    10060: (Failure.PERMANENT, "expected stream does not match"),
    10097: (Failure.PERMANENT, "header size exceeds maximum allowed of 64k"),
    10165: (Failure.PERMANENT, "invalid per-message TTL"),
    10169: (Failure.PERMANENT, "message counter increment is missing (a plain message on a counter stream)"),
    10170: (Failure.PERMANENT, "message counter has payload"),
    10171: (Failure.PERMANENT, "message counter increment is invalid"),
    10172: (Failure.PERMANENT, "message counter is broken"),
    10174: (Failure.PERMANENT, "atomic publish is disabled"),
    10175: (Failure.PERMANENT, "atomic publish sequence is missing"),
    10176: (Failure.PERMANENT, "atomic publish batch is incomplete"),
    10177: (Failure.PERMANENT, "atomic publish unsupported header used"),
    10179: (Failure.PERMANENT, "atomic publish batch ID is invalid"),
    10185: (Failure.PERMANENT, "JetStream minimum api level required"),
    10186: (Failure.PERMANENT, "stream mirrors can not also schedule messages"),
    10187: (Failure.PERMANENT, "stream source can not also schedule messages"),
    10188: (Failure.PERMANENT, "message schedules is disabled"),
    10189: (Failure.PERMANENT, "message schedules pattern is invalid"),
    10190: (Failure.PERMANENT, "message schedules target is invalid"),
    10191: (Failure.PERMANENT, "message schedules invalid per-message TTL"),
    10192: (Failure.PERMANENT, "message schedules invalid rollup"),
    10193: (Failure.PERMANENT, "missing sequence for expected last sequence per subject"),
    10199: (Failure.PERMANENT, "atomic publish batch is too large"),
    10200: (Failure.PERMANENT, "atomic publish batch commit is invalid"),
    10201: (Failure.PERMANENT, "atomic publish batch contains duplicate message id"),
    10203: (Failure.PERMANENT, "message schedules source is invalid"),
    10205: (Failure.PERMANENT, "batch publish is disabled"),
    10206: (Failure.PERMANENT, "batch publish pattern is invalid"),
    10207: (Failure.PERMANENT, "batch publish ID is invalid"),
    10212: (Failure.PERMANENT, "message schedules invalid scheduler"),
    10223: (Failure.PERMANENT, "message schedules time zone is invalid"),
    10227: (Failure.PERMANENT, "message stream source header is not allowed"),
}

FULL_HINTS = ("maximum messages", "maximum bytes", "resource limits", "insufficient resources")


def classify(err: PublishError) -> Failure:
    """The class of one failed publish (JetStream error JSON, a status reply, or a local failure)."""
    text = err.description.lower()
    if "maximum payload" in text or "message too large" in text:  # over the server's or the store's limit
        return Failure.PERMANENT
    if err.code:
        known = CODES.get(err.code)
        return known[0] if known else Failure.UNKNOWN
    if err.status == 503 or err.status == 0:  # no responders (stream or JetStream gone), timeouts, disconnects
        return Failure.TRANSIENT
    if any(hint in text for hint in FULL_HINTS):
        return Failure.BLOCKED
    return Failure.UNKNOWN


def uncertain(err: PublishError) -> bool:
    """No answer from the target (timeout, lost connection): the message may or may not have landed."""
    return err.code == 0 and err.status == 0
