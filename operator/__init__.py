"""The stream-replicator Kubernetes operator (import package `replication_operator`).

Pure modules (`spec`, `naming`, `worker_config`, `builders`, `status`) turn a StreamReplication
into Kubernetes objects; `reconciler` applies them through `kube`; `handlers` wires kopf to it;
`main` is the `stream-replicator-operator` command.
"""
