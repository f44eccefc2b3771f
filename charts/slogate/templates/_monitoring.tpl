{{/* Labels of the prometheus-operator objects: the chart's plus monitoring.labels. */}}
{{- define "slogate.monitoringLabels" -}}
{{ include "slogate.labels" . }}
{{- with .Values.monitoring.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}
