{{/*
What the operator calls, per namespace it serves: slogate_operator.rbac.PERMISSIONS, the
table in docs/operator.md ("RBAC: what the operator calls"); a chart test checks the two
agree. Namespaced rules: a Role per watched namespace, or one ClusterRole when the
operator watches all namespaces. (The `namespaces` rule of that table is only for
namespace globs, which values.schema.json does not accept.)
*/}}
{{- define "slogate.namespacedRules" -}}
# AdmissionPolicies: watched, patched (kopf's finalizer and progress annotations).
- apiGroups: ["slogate.dev"]
  resources: ["admissionpolicies"]
  verbs: ["get", "list", "watch", "patch"]
# Conditions, the calibration and thresholds in force, the pushed count.
- apiGroups: ["slogate.dev"]
  resources: ["admissionpolicies/status"]
  verbs: ["patch"]
# Targets: found, fingerprinted, claimed, their pod template patched to inject or remove the
# sidecar; one re-read (get) after a conflicting write.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "patch"]
# Pod IPs to push thresholds to; a calibration pod's termination message (the result).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
# One calibration Job per fingerprint; a failed or superseded one deleted.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "delete"]
# The thresholds ConfigMap the sidecars mount.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create", "patch"]
# The sidecar admin token: created (a create names no object), then read to push and each
# policy added as an owner: that Secret only, by name.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
- apiGroups: [""]
  resources: ["secrets"]
  resourceNames: [{{ .Values.operator.adminTokenSecretName | quote }}]
  verbs: ["get", "patch"]
# Each policy's NetworkPolicy <policy>-gate on its gated pods (operator.networkPolicy).
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "create", "patch", "delete"]
# spec.autoscaling: one KEDA ScaledObject (engine keda) or HPA (engine hpa) per target, kept as
# the spec says and deleted when disabled; the HPA's desired and current replicas read back
# (KEDA's own HPA for a ScaledObject). Never the Deployment's replicas: the HPA controller writes those.
- apiGroups: ["keda.sh"]
  resources: ["scaledobjects"]
  verbs: ["list", "create", "patch", "delete"]
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get", "list", "create", "patch", "delete"]
# Warning and Normal events on the policies (core v1 events: kopf's and the operator's own).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}

{{/* kopf peering: the replicas announce themselves and elect the active one. */}}
{{- define "slogate.namespacedPeeringRules" -}}
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}

{{- define "slogate.clusterPeeringRules" -}}
- apiGroups: ["kopf.dev"]
  resources: ["clusterkopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}

{{/* The injection webhook's configuration (the chart's): the CA bundle and one entry per
gated target. Cluster-scoped, so always in the ClusterRole; that object only, by name. */}}
{{- define "slogate.webhookRules" -}}
- apiGroups: ["admissionregistration.k8s.io"]
  resources: ["mutatingwebhookconfigurations"]
  resourceNames: [{{ printf "%s-injector" (include "slogate.fullname" .) | quote }}]
  verbs: ["get", "patch"]
{{- end }}

{{/* kopf scans CRDs at start and on change to find the resources it serves. */}}
{{- define "slogate.discoveryRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- end }}
