{{/*
The alert rules: the one source of slogate's alerts. The PrometheusRule renders
"slogate.alertGroups"; the tests render the chart and feed spec.groups to promtool and to a
real Prometheus. Every ratio follows docs/metrics.md: slogate_requests_total (one per
arrival) is the denominator, never slogate_decisions_total (one per failed predicate).

Each alert is one dict handed to "slogate.alertRule", the only template that writes a rule.
Its PromQL is a "slogate.expr.*" template, written out over lines as Prometheus reads it
with the values filled in (a fixed expression is a plain string). Its summary and
description are Prometheus templates ($labels, $value): Helm leaves them alone because it
only ever sees them inside its own quoted strings (the $value, $who, $pod and $policy
pieces of "slogate.alertGroups").
*/}}

{{/*
One alert rule from one dict:
  values       the alert's block of .Values.alerts: enabled, for, severity
  name         the alert's name; its runbook is the section of that name, in lower case,
               of the runbooks page ("slogate.runbooksPage")
  expr         its PromQL
  summary, description
  root         the chart's context (alerts.labels, the runbooks page)
A disabled alert renders nothing.
*/}}
{{- define "slogate.alertRule" -}}
{{- if .values.enabled -}}
- alert: {{ .name }}
  expr: |
    {{- .expr | nindent 4 }}
  for: {{ index .values "for" }}
  labels:
    severity: {{ .values.severity }}
    {{- with .root.Values.alerts.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    summary: {{ .summary | quote }}
    description: {{ .description | quote }}
    runbook_url: {{ printf "%s#%s" (include "slogate.runbooksPage" .root) (lower .name) | quote }}
{{- end -}}
{{- end }}

{{/*
The runbooks page every runbook_url points into: alerts.runbookBaseUrl when set (your own
copy), else docs/runbooks.md under docs.baseURL, else the bare path docs/runbooks.md (no
project site is published: a file of the slogate source, with no host that pretends one).
*/}}
{{- define "slogate.runbooksPage" -}}
{{- if .Values.alerts.runbookBaseUrl -}}
{{- trimSuffix "/" .Values.alerts.runbookBaseUrl -}}
{{- else if .Values.docs.baseURL -}}
{{- printf "%s/docs/runbooks.md" (trimSuffix "/" .Values.docs.baseURL) -}}
{{- else -}}
docs/runbooks.md
{{- end -}}
{{- end }}

{{/*
The share of arrivals refused: rejected at once, or deferred until the wait ran out (`or`
rather than `+`, so a missing series, no deferrals configured, does not empty the sum); above
the threshold, on a workload busy enough for a ratio to mean something.
Dict: by, window, minRate, alert (sheddingWarning or sheddingCritical), severity.
*/}}
{{- define "slogate.expr.shedding" -}}
sum by ({{ .by }}) (
  rate(slogate_requests_total{outcome="reject"}[{{ .window }}])
  or rate(slogate_deferral_outcomes_total{result="timed_out"}[{{ .window }}])
)
/ sum by ({{ .by }}) (rate(slogate_requests_total[{{ .window }}]))
{{ include "slogate.expr.sheddingThreshold" . }}
and
sum by ({{ .by }}) (rate(slogate_requests_total[{{ .window }}])) > {{ .minRate }}
{{- end }}

{{/*
The shedding threshold a ratio is compared with. A fixed `ratio` in the values applies to
every policy. Otherwise each policy's own spec.alerting figure, which the operator exports
as slogate_operator_alerting_rejection_ratio{namespace, policy, severity}, and
`fallbackRatio` for series with no such figure (operator not scraped, sidecar not injected
by a policy): `or` fills the gap per (namespace, policy). The join needs namespace and
policy among alerts.groupBy, which "slogate.alertGroups" checks.
*/}}
{{- define "slogate.expr.sheddingThreshold" -}}
{{- if kindIs "invalid" .alert.ratio -}}
> on (namespace, policy) group_left ()
(
  max by (namespace, policy) (slogate_operator_alerting_rejection_ratio{severity="{{ .severity }}"})
  or on (namespace, policy)
  0 * sum by (namespace, policy) (rate(slogate_requests_total[{{ .window }}])) + {{ .alert.fallbackRatio }}
)
{{- else -}}
> {{ .alert.ratio }}
{{- end -}}
{{- end }}

{{/* The threshold in words, for the description. Dict: alert, field (of spec.alerting). */}}
{{- define "slogate.sheddingLimitText" -}}
{{- if kindIs "invalid" .alert.ratio -}}
{{- printf "the policy's spec.alerting.%s (%.4g%% where the operator's figure is not scraped)" .field (mulf .alert.fallbackRatio 100) -}}
{{- else -}}
{{- printf "%.4g%%" (mulf .alert.ratio 100) -}}
{{- end -}}
{{- end }}

{{/*
Shedding (the warning's condition, "slogate.expr.shedding") on a workload whose
HorizontalPodAutoscaler is in a given state ("slogate.expr.hpaOfWorkload"). The shedding
ratio is the value; the HPA only selects. Dict: shedding (the dict of "slogate.expr.shedding"),
hpa (the dict of "slogate.expr.hpaOfWorkload").
*/}}
{{- define "slogate.expr.sheddingWithHpa" -}}
(
  {{- include "slogate.expr.shedding" .shedding | nindent 2 }}
)
and on (namespace, workload)
{{ include "slogate.expr.hpaOfWorkload" .hpa }}
{{- end }}

{{/*
The workloads whose HPA compares its replicas so: kube-state-metrics' status `left`
(current_replicas) against `right` (spec_max_replicas, status_desired_replicas), per
(namespace, workload). kube_horizontalpodautoscaler_info names the HPA's target; the
Deployment is the workload (the PodMonitor's label), whoever made the HPA: the operator's
engine hpa, KEDA (keda-hpa-<ScaledObject>) or a person. `max by` drops kube-state-metrics'
own target labels (its pod, instance) and the duplicates of its replicas.
Dict: left, op, right.
*/}}
{{- define "slogate.expr.hpaOfWorkload" -}}
max by (namespace, workload) (
  (
    max by (namespace, horizontalpodautoscaler) (kube_horizontalpodautoscaler_status_{{ .left }})
    {{ .op }}
    max by (namespace, horizontalpodautoscaler) (kube_horizontalpodautoscaler_{{ .right }})
  )
  * on (namespace, horizontalpodautoscaler) group_left (workload)
  label_replace(
    max by (namespace, horizontalpodautoscaler, scaletargetref_name) (
      kube_horizontalpodautoscaler_info{scaletargetref_kind="Deployment"}
    ),
    "workload", "$1", "scaletargetref_name", "(.+)"
  )
)
{{- end }}

{{/* Admitted requests whose first token missed their class's TTFT SLO. Dict: by, alert. */}}
{{- define "slogate.expr.admittedMissingSlo" -}}
sum by ({{ .by }}) (rate(slogate_slo_requests_total{result="missed"}[{{ .alert.window }}]))
/ sum by ({{ .by }}) (rate(slogate_slo_requests_total[{{ .alert.window }}]))
> {{ .alert.missRatio }}
and
sum by ({{ .by }}) (increase(slogate_slo_requests_total[{{ .alert.window }}])) >= {{ .alert.minRequests }}
{{- end }}

{{/* The median TTFT prediction error out of its band. Dict: by, alert. */}}
{{- define "slogate.expr.ttftPredictionDrift" -}}
{{- $median := include "slogate.expr.medianPredictionError" . -}}
(
  {{ $median }} > {{ .alert.optimisticAbove }}
  or
  {{ $median }} < {{ .alert.pessimisticBelow }}
)
and
sum by ({{ .by }}) (increase(slogate_ttft_prediction_error_ratio_count[{{ .alert.window }}])) >= {{ .alert.minRequests }}
{{- end }}

{{- define "slogate.expr.medianPredictionError" -}}
histogram_quantile(0.5, sum by (le, {{ .by }}) (rate(slogate_ttft_prediction_error_ratio_bucket[{{ .alert.window }}])))
{{- end }}

{{/* Failed calibrations, unless one of the current container is in force. Dict: alert. */}}
{{- define "slogate.expr.calibrationFailing" -}}
sum by (namespace, policy) (
  increase(slogate_operator_calibrations_total{outcome=~"failed|timed_out|invalid_result|rejected"}[{{ .alert.window }}])
) > 0
unless on (namespace, policy)
max by (namespace, policy) (slogate_operator_policy_condition{type="Calibrated"}) == 1
{{- end }}

{{/* Threshold pushes the sidecar refused. Dict: alert. */}}
{{- define "slogate.expr.thresholdsRejected" -}}
increase(slogate_threshold_updates_total{result="rejected"}[{{ .alert.window }}]) > 0
{{- end }}

{{- define "slogate.alertGroups" -}}
{{- $a := .Values.alerts }}
{{- $by := join ", " $a.groupBy }}
{{- $w := $a.window }}
{{- range list $a.sheddingWarning $a.sheddingCritical }}
{{- if and .enabled (kindIs "invalid" .ratio) (not (and (has "namespace" $a.groupBy) (has "policy" $a.groupBy))) }}
{{- fail "alerts.groupBy must include namespace and policy to compare with each policy's spec.alerting ratios; or set alerts.sheddingWarning.ratio and alerts.sheddingCritical.ratio" }}
{{- end }}
{{- end }}
{{- /* Prometheus template pieces of the annotations: Helm sees them as plain strings. */}}
{{- if and (or $a.sheddingAtMaxReplicas.enabled $a.sheddingWhileScalingUp.enabled) (not (and (has "namespace" $a.groupBy) (has "workload" $a.groupBy))) }}
{{- fail "alerts.groupBy must include namespace and workload to join shedding with the workload's HorizontalPodAutoscaler; or disable alerts.sheddingAtMaxReplicas and alerts.sheddingWhileScalingUp" }}
{{- end }}
{{- $sheds := dict "by" $by "window" $w "minRate" $a.minRequestsPerSecond "alert" $a.sheddingWarning "severity" "warning" }}
{{- $value := "{{ $value | humanizePercentage }}" }}
{{- $pod := "{{ $labels.namespace }}/{{ $labels.pod }}" }}
{{- $policy := "{{ $labels.namespace }}/{{ $labels.policy }}" }}
{{- $parts := list }}
{{- range $a.groupBy }}
{{- $parts = append $parts (printf "{{ $labels.%s }}" .) }}
{{- end }}
{{- $who := join "/" $parts -}}
- name: slogate-shedding
  rules:
    {{- include "slogate.alertRule" (dict "root" $ "values" $a.sheddingWarning
          "name" "SlogateSheddingWarning"
          "expr" (include "slogate.expr.shedding" (dict "by" $by "window" $w "minRate" $a.minRequestsPerSecond
                    "alert" $a.sheddingWarning "severity" "warning"))
          "summary" (printf "%s refuses %s of requests" $who $value)
          "description" (printf "%s of arrivals at %s were refused (429 at once, or deferred until the wait ran out) over %s, more than %s: demand exceeds what the SLO lets this workload serve. Add replicas, or accept the shedding."
                           $value $who $w (include "slogate.sheddingLimitText" (dict "alert" $a.sheddingWarning "field" "rejectionRatioWarning")))) | nindent 4 }}
    {{- include "slogate.alertRule" (dict "root" $ "values" $a.sheddingCritical
          "name" "SlogateSheddingCritical"
          "expr" (include "slogate.expr.shedding" (dict "by" $by "window" $w "minRate" $a.minRequestsPerSecond
                    "alert" $a.sheddingCritical "severity" "critical"))
          "summary" (printf "%s refuses %s of requests" $who $value)
          "description" (printf "%s of arrivals at %s were refused over %s, more than %s: a large share of users gets 429s. Scale out now, or find what made the server slower (thresholds, rates)."
                           $value $who $w (include "slogate.sheddingLimitText" (dict "alert" $a.sheddingCritical "field" "rejectionRatioCritical")))) | nindent 4 }}
{{- if or $a.sheddingAtMaxReplicas.enabled $a.sheddingWhileScalingUp.enabled }}
- name: slogate-autoscaling
  rules:
    {{- with $a.sheddingAtMaxReplicas }}
    {{- include "slogate.alertRule" (dict "root" $ "values" .
          "name" "SlogateSheddingAtMaxReplicas"
          "expr" (include "slogate.expr.sheddingWithHpa" (dict "shedding" $sheds
                    "hpa" (dict "left" "current_replicas" "op" ">=" "right" "spec_max_replicas")))
          "summary" (printf "%s refuses %s of requests at its maximum replicas" $who $value)
          "description" (printf "%s of arrivals at %s were refused over %s, more than %s, while its HorizontalPodAutoscaler runs its maxReplicas: capacity is exhausted and no pod will be added. Raise the autoscaler's maximum (and the nodes to run it), or accept the shedding."
                           $value $who $w (include "slogate.sheddingLimitText" (dict "alert" $a.sheddingWarning "field" "rejectionRatioWarning")))) | nindent 4 }}
    {{- end }}
    {{- with $a.sheddingWhileScalingUp }}
    {{- include "slogate.alertRule" (dict "root" $ "values" .
          "name" "SlogateSheddingWhileScalingUp"
          "expr" (include "slogate.expr.sheddingWithHpa" (dict "shedding" $sheds
                    "hpa" (dict "left" "current_replicas" "op" "<" "right" "status_desired_replicas")))
          "summary" (printf "%s refuses %s of requests while scaling up" $who $value)
          "description" (printf "%s of arrivals at %s were refused over %s, more than %s, while its HorizontalPodAutoscaler wants more replicas than run: expected while new pods start and load the model, but it has lasted %s. See why the new pods are not Ready (Pending, image pull, model load, calibration)."
                           $value $who $w (include "slogate.sheddingLimitText" (dict "alert" $a.sheddingWarning "field" "rejectionRatioWarning")) (index . "for"))) | nindent 4 }}
    {{- end }}
{{- end }}
- name: slogate-prediction
  rules:
    {{- with $a.admittedMissingSlo }}
    {{- include "slogate.alertRule" (dict "root" $ "values" .
          "name" "SlogateAdmittedMissingSlo"
          "expr" (include "slogate.expr.admittedMissingSlo" (dict "by" $by "alert" .))
          "summary" (printf "%s: %s of admitted requests miss their TTFT SLO" $who $value)
          "description" (printf "The gate admitted requests at %s that then missed their class's TTFT SLO (more than %.4g%% of them over %s): the gate is lying. Its thresholds or rates no longer describe the server."
                           $who (mulf .missRatio 100) .window)) | nindent 4 }}
    {{- end }}
    {{- with $a.ttftPredictionDrift }}
    {{- include "slogate.alertRule" (dict "root" $ "values" .
          "name" "SlogateTTFTPredictionDrift"
          "expr" (include "slogate.expr.ttftPredictionDrift" (dict "by" $by "alert" .))
          "summary" (printf "%s: median TTFT prediction error %s" $who $value)
          "description" (printf "The median of (actual - predicted) / predicted TTFT at %s left [%v, %v] over %s: the calibrated rates are stale (a new model, quantization, node type or noisy neighbour). Recalibrate."
                           $who .pessimisticBelow .optimisticAbove .window)) | nindent 4 }}
    {{- end }}
- name: slogate-gate-health
  rules:
    {{- with $a.calibrationFailing }}
    {{- include "slogate.alertRule" (dict "root" $ "values" .
          "name" "SlogateCalibrationFailing"
          "expr" (include "slogate.expr.calibrationFailing" (dict "alert" .))
          "summary" (printf "AdmissionPolicy %s: calibration failing" $policy)
          "description" (printf "Calibration of AdmissionPolicy %s failed within %s and no calibration of the current llama.cpp container is in force. The sidecars keep the last good thresholds, which may not describe the server that now runs. See the policy's Degraded condition and the Job's logs."
                           $policy .window)) | nindent 4 }}
    {{- end }}
    {{- include "slogate.alertRule" (dict "root" $ "values" $a.thresholdsMissing
          "name" "SlogateSidecarWithoutThresholds"
          "expr" "slogate_thresholds_loaded == 0"
          "summary" (printf "Sidecar %s serves without thresholds" $pod)
          "description" (printf "The slogate sidecar in %s has no thresholds loaded: it cannot decide and refuses every request, and its pod is not Ready. The thresholds ConfigMap is missing or unreadable, or no push reached it."
                           $pod)) | nindent 4 }}
    {{- with $a.thresholdsRejected }}
    {{- include "slogate.alertRule" (dict "root" $ "values" .
          "name" "SlogateThresholdsRejected"
          "expr" (include "slogate.expr.thresholdsRejected" (dict "alert" .))
          "summary" (printf "Sidecar %s refused new thresholds" $pod)
          "description" (printf "A thresholds push to %s failed validation within %s; the previous thresholds stay in force. The operator and the sidecar disagree on the thresholds schema (version skew?)."
                           $pod .window)) | nindent 4 }}
    {{- end }}
    {{- include "slogate.alertRule" (dict "root" $ "values" $a.upstreamUnreachable
          "name" "SlogateUpstreamUnreachable"
          "expr" "slogate_upstream_up == 0"
          "summary" (printf "Sidecar %s cannot reach llama-server" $pod)
          "description" (printf "The slogate sidecar in %s has failed to read llama-server's /health and /metrics: it answers 503 to every request. llama-server is down, still loading its model, or listens elsewhere than --upstream."
                           $pod)) | nindent 4 }}
{{- end }}
