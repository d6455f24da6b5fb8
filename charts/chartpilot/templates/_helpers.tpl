{{- define "chartpilot.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}{{ .Release.Name | trunc 63 | trimSuffix "-" }}{{ else }}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}{{ end }}
{{- end }}

{{- define "chartpilot.labels" -}}
app.kubernetes.io/name: chartpilot
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
{{- end }}

{{- define "chartpilot.selector" -}}
app.kubernetes.io/name: chartpilot
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/component: manager
{{- end }}

{{- define "chartpilot.serviceAccount" -}}
{{- default (include "chartpilot.fullname" .) .Values.serviceAccount.name }}
{{- end }}

{{- define "chartpilot.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest }}{{ printf "%s@%s" .Values.image.repository .Values.image.digest }}{{ else }}{{ printf "%s:%s" .Values.image.repository $tag }}{{ end }}
{{- end }}

