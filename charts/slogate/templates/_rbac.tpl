{{/*
What the operator calls, per namespace it serves (docs/operator.md, "RBAC: what the
operator calls"). Namespaced rules: a Role per watched namespace, or one ClusterRole
when the operator watches all namespaces.
*/}}
{{- define "slogate.namespacedRules" -}}
# AdmissionPolicies: watched, patched (finalizer, kopf's annotations) and given a status.
- apiGroups: ["slogate.dev"]
  resources: ["admissionpolicies"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["slogate.dev"]
  resources: ["admissionpolicies/status", "admissionpolicies/finalizers"]
  verbs: ["get", "patch"]
# Targets: fingerprinted, and their pod template patched to inject or remove the sidecar.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "patch"]
# Ready pods receive the thresholds push; calibration pods report their result.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
# One calibration Job per fingerprint; deleted when superseded.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["create", "get", "list", "watch", "delete"]
# The thresholds ConfigMap the sidecars mount.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "create", "patch"]
# The sidecar admin token: created once, read to push.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create"]
# Warning and Normal events on the policies.
- apiGroups: ["", "events.k8s.io"]
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

{{/* kopf scans CRDs at start and on change to find the resources it serves. */}}
{{- define "slogate.discoveryRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- end }}
