"""The stream-replicator Kubernetes operator (import package `replication_operator`).

Layered like the data plane (tests/test_layout.py): `model/` is what a StreamReplication is (typed
spec, CRD schema, names, status conditions); `checks/` what is checked before anything is built;
`build/` the children, pure; `nats/` and `engine/` what the operator reads and writes in NATS;
`reconcile/` the pass that applies it all through `kube`; `handlers` wires kopf to it; `main` is the
`stream-replicator-operator` command. ARCHITECTURE.md walks through it.
"""
