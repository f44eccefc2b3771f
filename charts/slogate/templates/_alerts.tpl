{{/*
The alert rule groups: the one source of slogate's alerts. The PrometheusRule renders
them; the tests render the chart and feed spec.groups to promtool and to a real
Prometheus. Every ratio follows docs/metrics.md: slogate_requests_total (one per arrival)
is the denominator, never slogate_decisions_total (one per failed predicate).
Annotations are Prometheus templates, kept away from Helm inside {{` ... `}}.
*/}}

{{- define "slogate.alertAnnotations" -}}
summary: {{ .summary | quote }}
description: {{ .description | quote }}
runbook_url: {{ printf "%s#%s" (include "slogate.runbooksPage" .root) (lower .name) | quote }}
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

{{- define "slogate.alertLabels" -}}
severity: {{ .alert.severity }}
{{- with .root.Values.alerts.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The shedding threshold a ratio is compared with. A fixed `ratio` in the values applies to
every policy. Otherwise each policy's own spec.alerting figure, which the operator exports
as slogate_operator_alerting_rejection_ratio{namespace, policy, severity}, and
`fallbackRatio` for series with no such figure (operator not scraped, sidecar not injected
by a policy): `or` fills the gap per (namespace, policy).
*/}}
{{- define "slogate.sheddingThreshold" -}}
{{- if kindIs "invalid" .alert.ratio -}}
{{- if not (and (has "namespace" .root.Values.alerts.groupBy) (has "policy" .root.Values.alerts.groupBy)) -}}
{{- fail "alerts.groupBy must include namespace and policy to compare with each policy's spec.alerting ratios; or set alerts.sheddingWarning.ratio and alerts.sheddingCritical.ratio" -}}
{{- end -}}
{{- printf "> on (namespace, policy) group_left ()\n(\n  max by (namespace, policy) (slogate_operator_alerting_rejection_ratio{severity=\"%s\"})\n  or on (namespace, policy)\n  0 * sum by (namespace, policy) (rate(slogate_requests_total[%s])) + %v\n)" .severity .root.Values.alerts.window .alert.fallbackRatio -}}
{{- else -}}
{{- printf "> %v" .alert.ratio -}}
{{- end -}}
{{- end }}

{{- define "slogate.sheddingLimitText" -}}
{{- if kindIs "invalid" .alert.ratio -}}
{{- printf "the policy's spec.alerting.%s (%.4g%% where the operator's figure is not scraped)" .field (mulf .alert.fallbackRatio 100) -}}
{{- else -}}
{{- printf "%.4g%%" (mulf .alert.ratio 100) -}}
{{- end -}}
{{- end }}

{{- define "slogate.alertGroups" -}}
{{- $a := .Values.alerts }}
{{- $by := join ", " $a.groupBy }}
{{- $w := $a.window }}
{{- $where := join " }}/{{ $labels." $a.groupBy }}
{{- $who := printf "{{ $labels.%s }}" $where }}
{{- /* Refused: rejected at once, or deferred until the wait ran out. `or` rather than `+`,
       so a missing series (no deferrals configured) does not empty the sum. */}}
{{- $refused := printf "sum by (%s) (\n  rate(slogate_requests_total{outcome=\"reject\"}[%s])\n  or rate(slogate_deferral_outcomes_total{result=\"timed_out\"}[%s])\n)\n/ sum by (%s) (rate(slogate_requests_total[%s]))" $by $w $w $by $w }}
{{- $busy := printf "sum by (%s) (rate(slogate_requests_total[%s])) > %v" $by $w $a.minRequestsPerSecond -}}
- name: slogate-shedding
  rules:
    {{- with $a.sheddingWarning }}
    {{- if .enabled }}
    - alert: SlogateSheddingWarning
      expr: |
        {{- printf "%s\n%s\nand\n%s" $refused (include "slogate.sheddingThreshold" (dict "root" $ "alert" . "severity" "warning")) $busy | nindent 8 }}
      for: {{ index . "for" }}
      labels:
        {{- include "slogate.alertLabels" (dict "alert" . "root" $) | nindent 8 }}
      annotations:
        {{- include "slogate.alertAnnotations" (dict "root" $ "name" "SlogateSheddingWarning"
              "summary" (printf "%s refuses {{ $value | humanizePercentage }} of requests" $who)
              "description" (printf "{{ $value | humanizePercentage }} of arrivals at %s were refused (429 at once, or deferred until the wait ran out) over %s, more than %s: demand exceeds what the SLO lets this workload serve. Add replicas, or accept the shedding." $who $w (include "slogate.sheddingLimitText" (dict "alert" . "field" "rejectionRatioWarning")))) | nindent 8 }}
    {{- end }}
    {{- end }}
    {{- with $a.sheddingCritical }}
    {{- if .enabled }}
    - alert: SlogateSheddingCritical
      expr: |
        {{- printf "%s\n%s\nand\n%s" $refused (include "slogate.sheddingThreshold" (dict "root" $ "alert" . "severity" "critical")) $busy | nindent 8 }}
      for: {{ index . "for" }}
      labels:
        {{- include "slogate.alertLabels" (dict "alert" . "root" $) | nindent 8 }}
      annotations:
        {{- include "slogate.alertAnnotations" (dict "root" $ "name" "SlogateSheddingCritical"
              "summary" (printf "%s refuses {{ $value | humanizePercentage }} of requests" $who)
              "description" (printf "{{ $value | humanizePercentage }} of arrivals at %s were refused over %s, more than %s: a large share of users gets 429s. Scale out now, or find what made the server slower (thresholds, rates)." $who $w (include "slogate.sheddingLimitText" (dict "alert" . "field" "rejectionRatioCritical")))) | nindent 8 }}
    {{- end }}
    {{- end }}
- name: slogate-prediction
  rules:
    {{- with $a.admittedMissingSlo }}
    {{- if .enabled }}
    - alert: SlogateAdmittedMissingSlo
      expr: |
        {{- printf "sum by (%s) (rate(slogate_slo_requests_total{result=\"missed\"}[%s]))\n/ sum by (%s) (rate(slogate_slo_requests_total[%s]))\n> %v\nand\nsum by (%s) (increase(slogate_slo_requests_total[%s])) >= %v" $by .window $by .window .missRatio $by .window .minRequests | nindent 8 }}
      for: {{ index . "for" }}
      labels:
        {{- include "slogate.alertLabels" (dict "alert" . "root" $) | nindent 8 }}
      annotations:
        {{- include "slogate.alertAnnotations" (dict "root" $ "name" "SlogateAdmittedMissingSlo"
              "summary" (printf "%s: {{ $value | humanizePercentage }} of admitted requests miss their TTFT SLO" $who)
              "description" (printf "The gate admitted requests at %s that then missed their class's TTFT SLO (more than %.4g%% of them over %s): the gate is lying. Its thresholds or rates no longer describe the server." $who (mulf .missRatio 100) .window)) | nindent 8 }}
    {{- end }}
    {{- end }}
    {{- with $a.ttftPredictionDrift }}
    {{- if .enabled }}
    {{- $median := printf "histogram_quantile(0.5, sum by (le, %s) (rate(slogate_ttft_prediction_error_ratio_bucket[%s])))" $by .window }}
    - alert: SlogateTTFTPredictionDrift
      expr: |
        {{- printf "(\n  %s > %v\n  or\n  %s < %v\n)\nand\nsum by (%s) (increase(slogate_ttft_prediction_error_ratio_count[%s])) >= %v" $median .optimisticAbove $median .pessimisticBelow $by .window .minRequests | nindent 8 }}
      for: {{ index . "for" }}
      labels:
        {{- include "slogate.alertLabels" (dict "alert" . "root" $) | nindent 8 }}
      annotations:
        {{- include "slogate.alertAnnotations" (dict "root" $ "name" "SlogateTTFTPredictionDrift"
              "summary" (printf "%s: median TTFT prediction error {{ $value | humanizePercentage }}" $who)
              "description" (printf "The median of (actual - predicted) / predicted TTFT at %s left [%v, %v] over %s: the calibrated rates are stale (a new model, quantization, node type or noisy neighbour). Recalibrate." $who .pessimisticBelow .optimisticAbove .window)) | nindent 8 }}
    {{- end }}
    {{- end }}
- name: slogate-gate-health
  rules:
    {{- with $a.calibrationFailing }}
    {{- if .enabled }}
    - alert: SlogateCalibrationFailing
      expr: |
        {{- printf "sum by (namespace, policy) (\n  increase(slogate_operator_calibrations_total{outcome=~\"failed|timed_out|invalid_result|rejected\"}[%s])\n) > 0\nunless on (namespace, policy)\nmax by (namespace, policy) (slogate_operator_policy_condition{type=\"Calibrated\"}) == 1" .window | nindent 8 }}
      for: {{ index . "for" }}
      labels:
        {{- include "slogate.alertLabels" (dict "alert" . "root" $) | nindent 8 }}
      annotations:
        {{- include "slogate.alertAnnotations" (dict "root" $ "name" "SlogateCalibrationFailing"
              "summary" "AdmissionPolicy {{ $labels.namespace }}/{{ $labels.policy }}: calibration failing"
              "description" (printf "Calibration of AdmissionPolicy {{ $labels.namespace }}/{{ $labels.policy }} failed within %s and no calibration of the current llama.cpp container is in force. The sidecars keep the last good thresholds, which may not describe the server that now runs. See the policy's Degraded condition and the Job's logs." .window)) | nindent 8 }}
    {{- end }}
    {{- end }}
    {{- with $a.thresholdsMissing }}
    {{- if .enabled }}
    - alert: SlogateSidecarWithoutThresholds
      expr: |
        {{- "slogate_thresholds_loaded == 0" | nindent 8 }}
      for: {{ index . "for" }}
      labels:
        {{- include "slogate.alertLabels" (dict "alert" . "root" $) | nindent 8 }}
      annotations:
        {{- include "slogate.alertAnnotations" (dict "root" $ "name" "SlogateSidecarWithoutThresholds"
              "summary" "Sidecar {{ $labels.namespace }}/{{ $labels.pod }} serves without thresholds"
              "description" "The slogate sidecar in {{ $labels.namespace }}/{{ $labels.pod }} has no thresholds loaded: it cannot decide and refuses every request, and its pod is not Ready. The thresholds ConfigMap is missing or unreadable, or no push reached it.") | nindent 8 }}
    {{- end }}
    {{- end }}
    {{- with $a.thresholdsRejected }}
    {{- if .enabled }}
    - alert: SlogateThresholdsRejected
      expr: |
        {{- printf "increase(slogate_threshold_updates_total{result=\"rejected\"}[%s]) > 0" .window | nindent 8 }}
      for: {{ index . "for" }}
      labels:
        {{- include "slogate.alertLabels" (dict "alert" . "root" $) | nindent 8 }}
      annotations:
        {{- include "slogate.alertAnnotations" (dict "root" $ "name" "SlogateThresholdsRejected"
              "summary" "Sidecar {{ $labels.namespace }}/{{ $labels.pod }} refused new thresholds"
              "description" (printf "A thresholds push to {{ $labels.namespace }}/{{ $labels.pod }} failed validation within %s; the previous thresholds stay in force. The operator and the sidecar disagree on the thresholds schema (version skew?)." .window)) | nindent 8 }}
    {{- end }}
    {{- end }}
    {{- with $a.upstreamUnreachable }}
    {{- if .enabled }}
    - alert: SlogateUpstreamUnreachable
      expr: |
        {{- "slogate_upstream_up == 0" | nindent 8 }}
      for: {{ index . "for" }}
      labels:
        {{- include "slogate.alertLabels" (dict "alert" . "root" $) | nindent 8 }}
      annotations:
        {{- include "slogate.alertAnnotations" (dict "root" $ "name" "SlogateUpstreamUnreachable"
              "summary" "Sidecar {{ $labels.namespace }}/{{ $labels.pod }} cannot reach llama-server"
              "description" "The slogate sidecar in {{ $labels.namespace }}/{{ $labels.pod }} has failed to read llama-server's /health and /metrics: it answers 503 to every request. llama-server is down, still loading its model, or listens elsewhere than --upstream.") | nindent 8 }}
    {{- end }}
    {{- end }}
{{- end }}
