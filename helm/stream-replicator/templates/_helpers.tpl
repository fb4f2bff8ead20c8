{{/*
Chart name, truncated to 63 characters (the Kubernetes label limit).
*/}}
{{- define "stream-replicator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: <release>-<chart>, or <release> alone when it already contains the chart name.
*/}}
{{- define "stream-replicator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Chart label value: <chart>-<version>.
*/}}
{{- define "stream-replicator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Common labels on every object; each template adds its app.kubernetes.io/component.
*/}}
{{- define "stream-replicator.labels" -}}
helm.sh/chart: {{ include "stream-replicator.chart" . }}
{{ include "stream-replicator.instanceLabels" . }}
app.kubernetes.io/version: {{ include "stream-replicator.tag" . | trunc 63 | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: stream-replicator
{{- end }}

{{/*
Labels that identify the release's objects.
*/}}
{{- define "stream-replicator.instanceLabels" -}}
app.kubernetes.io/name: {{ include "stream-replicator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Selector labels of the operator pod (immutable in a Deployment: never add release-varying values).
*/}}
{{- define "stream-replicator.selectorLabels" -}}
{{ include "stream-replicator.instanceLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/*
Name of the operator's ServiceAccount.
*/}}
{{- define "stream-replicator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "stream-replicator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Image tag: the value, else the chart's appVersion.
*/}}
{{- define "stream-replicator.tag" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{/*
Operator image reference.
*/}}
{{- define "stream-replicator.image" -}}
{{- printf "%s:%s" .Values.image.repository (include "stream-replicator.tag" .) }}
{{- end }}

{{/*
Default worker image (the operator image unless overridden).
*/}}
{{- define "stream-replicator.workerImage" -}}
{{- $repo := default .Values.image.repository .Values.workerImage.repository }}
{{- $tag := default (include "stream-replicator.tag" .) .Values.workerImage.tag }}
{{- printf "%s:%s" $repo $tag }}
{{- end }}

{{/*
Default fleet-health Spark image (Dockerfile target `spark`, tagged "<tag>-spark" unless overridden).
*/}}
{{- define "stream-replicator.sparkImage" -}}
{{- $repo := default .Values.image.repository .Values.sparkImage.repository }}
{{- $tag := default (printf "%s-spark" (include "stream-replicator.tag" .)) .Values.sparkImage.tag }}
{{- printf "%s:%s" $repo $tag }}
{{- end }}

{{/*
Namespaces the operator serves, as a JSON list; empty means all namespaces.
With namespaced RBAC and no list, the operator serves the release namespace only.
*/}}
{{- define "stream-replicator.namespaces" -}}
{{- $namespaces := .Values.operator.namespaces | default list }}
{{- if and (empty $namespaces) .Values.rbac.namespaced }}
{{- $namespaces = list .Release.Namespace }}
{{- end }}
{{- $namespaces | uniq | toJson }}
{{- end }}

{{/*
true when the operator serves every namespace (`--all-namespaces`, cluster-wide peering).
*/}}
{{- define "stream-replicator.clusterwide" -}}
{{- if empty (include "stream-replicator.namespaces" . | fromJsonArray) }}true{{ else }}false{{ end }}
{{- end }}

{{/*
Name of the kopf peering object.
*/}}
{{- define "stream-replicator.peeringName" -}}
{{- default (include "stream-replicator.fullname" .) .Values.peering.name }}
{{- end }}
