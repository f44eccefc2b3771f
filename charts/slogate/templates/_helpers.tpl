{{/* Names, labels and the image reference shared by every template. */}}

{{- define "slogate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name, at most 63 characters (a DNS label). */}}
{{- define "slogate.fullname" -}}
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

{{- define "slogate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "slogate.labels" -}}
helm.sh/chart: {{ include "slogate.chart" . }}
{{ include "slogate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: slogate
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "slogate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "slogate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "slogate.operatorSelectorLabels" -}}
{{ include "slogate.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "slogate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "slogate.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag, or repository@digest when a digest is pinned. */}}
{{- define "slogate.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "slogate.sidecarImage" -}}
{{- default (include "slogate.image" .) .Values.operator.sidecarImage }}
{{- end }}

{{/* Namespaces the operator serves: empty when it watches all of them. */}}
{{- define "slogate.watchedNamespaces" -}}
{{- if not .Values.operator.watch.allNamespaces }}
{{- if not .Values.operator.watch.namespaces }}
{{- fail "operator.watch.namespaces must list at least one namespace when operator.watch.allNamespaces is false" }}
{{- end }}
{{- join "," .Values.operator.watch.namespaces }}
{{- end }}
{{- end }}

{{/*
The restricted Pod Security Standard, for every container the chart runs. The operator
injects sidecars with the same securityContext (docs/deploy.md).
*/}}
{{- define "slogate.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "slogate.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
Who may reach the gated pods' admin port (the operator's admin_peers, a JSON list of
NetworkPolicy peers): this release's operator pods, Prometheus unless
networkPolicy.prometheus.enabled is false, and networkPolicy.extraAdminPeers. The operator writes them into each policy's
NetworkPolicy (slogate_operator/fence.py).
*/}}
{{- define "slogate.adminPeers" -}}
{{- $operator := dict
      "namespaceSelector" (dict "matchLabels" (dict "kubernetes.io/metadata.name" .Release.Namespace))
      "podSelector" (dict "matchLabels" (include "slogate.operatorSelectorLabels" . | fromYaml)) -}}
{{- $peers := list $operator -}}
{{- with .Values.networkPolicy.prometheus }}
{{- if .enabled }}
{{- $peers = append $peers (dict "namespaceSelector" .namespaceSelector "podSelector" (.podSelector | default dict)) -}}
{{- end }}
{{- end }}
{{- $peers = concat $peers .Values.networkPolicy.extraAdminPeers -}}
{{- toJson $peers -}}
{{- end }}
