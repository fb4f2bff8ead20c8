{{/*
THE ONE PLACE for the operator's RBAC rules. Every verb here matches a call the operator (or kopf on
its behalf) makes: tests/helm compares the rendered rules with the contract in helm_chart_support.py,
and tests/operator/test_operator_rbac.py with the calls the real operator makes against an emulator.

The result is a YAML map with two lists of PolicyRules:
  cluster:    rules on cluster-scoped resources (always granted by a ClusterRole)
  namespaced: rules on namespaced resources (a ClusterRole, or one Role per served namespace when
              rbac.namespaced is true)

Peering rules depend on the mode: cluster-wide operators (`--all-namespaces`) use ClusterKopfPeering,
namespace-restricted ones use a KopfPeering in each served namespace; standalone operators use none.
With rbac.rolesOnly the operator runs `--roles-only` and makes no cluster-scoped call: no cluster rules.
*/}}
{{- define "stream-replicator.rbacRules" -}}
{{- $clusterwide := eq (include "stream-replicator.clusterwide" .) "true" -}}
{{- $children := list "get" "list" "watch" "create" "patch" "delete" -}}
{{- if .Values.rbac.rolesOnly }}
cluster: []
{{- else }}
cluster:
  # kopf: resource discovery follows CRD changes.
  - apiGroups: ["apiextensions.k8s.io"]
    resources: ["customresourcedefinitions"]
    verbs: ["list", "watch"]
{{- if not $clusterwide }}
  # kopf: namespace tracking, namespace-restricted operators only (cluster-wide ones never list them).
  - apiGroups: [""]
    resources: ["namespaces"]
    verbs: ["list", "watch"]
{{- end }}
{{- if and .Values.peering.enabled $clusterwide }}
  # kopf peering, cluster-wide operators: the peering object is watched and patched (keep-alives),
  # never read by name.
  - apiGroups: ["kopf.dev"]
    resources: ["clusterkopfpeerings"]
    verbs: ["list", "watch", "patch"]
{{- end }}
{{- end }}
namespaced:
  # The custom resource: watched, annotated/finalized by kopf, and its status reported.
  - apiGroups: ["streamreplicator.io"]
    resources: ["streamreplications"]
    verbs: ["get", "list", "watch", "patch"]
  - apiGroups: ["streamreplicator.io"]
    resources: ["streamreplications/status"]
    verbs: ["patch"]
  # Shared connections: read (and watched, to reach their users when edited), their status reported;
  # the operator never writes or finalizes the object itself.
  - apiGroups: ["streamreplicator.io"]
    resources: ["natsconnections"]
    verbs: ["get", "list", "watch"]
  - apiGroups: ["streamreplicator.io"]
    resources: ["natsconnections/status"]
    verbs: ["patch"]
  # Children the operator builds for each StreamReplication (engine replicator): optional ones are
  # removed when the spec drops them, all of them when the resource moves to the native engine (the
  # Deployment first, in the foreground, so that its pods are gone before NATS copies).
  - apiGroups: [""]
    resources: ["configmaps", "services"]
    verbs: {{ $children | toJson }}
  - apiGroups: ["apps"]
    resources: ["deployments"]
    verbs: {{ $children | toJson }}
  - apiGroups: ["policy"]
    resources: ["poddisruptionbudgets"]
    verbs: {{ $children | toJson }}
  - apiGroups: ["networking.k8s.io"]
    resources: ["networkpolicies"]
    verbs: {{ $children | toJson }}
  - apiGroups: ["monitoring.coreos.com"]
    resources: ["servicemonitors"]
    verbs: {{ $children | toJson }}
  - apiGroups: ["sparkoperator.k8s.io"]
    resources: ["scheduledsparkapplications"]
    verbs: {{ $children | toJson }}
  # NATS credentials and TLS material referenced by the spec: read by name only (the same read gives
  # the opt-in label the tenancy policy checks; never list or watch, which would read every Secret).
  - apiGroups: [""]
    resources: ["secrets"]
    verbs: ["get"]
  # kopf posts core/v1 events about the resources it handles.
  - apiGroups: [""]
    resources: ["events"]
    verbs: ["create"]
{{- if and .Values.peering.enabled (not $clusterwide) }}
  # kopf peering, namespace-restricted operators.
  - apiGroups: ["kopf.dev"]
    resources: ["kopfpeerings"]
    verbs: ["list", "watch", "patch"]
{{- end }}
{{- end }}

{{/*
Rules for people, not for the operator: ClusterRoles aggregated into Kubernetes' user-facing roles
(templates/rbac-aggregated.yaml). `view` reads StreamReplications, their status and scale; `edit` (and
`admin`) also writes them and scales them. Nobody but the operator writes the status.
*/}}
{{- define "stream-replicator.userRules" -}}
view:
  - apiGroups: ["streamreplicator.io"]
    resources: ["streamreplications", "streamreplications/status", "streamreplications/scale",
                "natsconnections", "natsconnections/status"]
    verbs: ["get", "list", "watch"]
edit:
  - apiGroups: ["streamreplicator.io"]
    resources: ["streamreplications", "natsconnections"]
    verbs: ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]
  - apiGroups: ["streamreplicator.io"]
    resources: ["streamreplications/status", "natsconnections/status"]
    verbs: ["get", "list", "watch"]
  - apiGroups: ["streamreplicator.io"]
    resources: ["streamreplications/scale"]
    verbs: ["get", "list", "watch", "update", "patch"]
{{- end }}
