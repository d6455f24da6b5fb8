{{- define "publicdb.fullname" -}}
{{- printf "%s-publicdb" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "publicdb.labels" -}}
app.kubernetes.io/name: publicdb
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "publicdb.selectorLabels" -}}
app.kubernetes.io/name: publicdb
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Renders a value that may be empty: prints null, [] or {} as given. */}}
{{- define "publicdb.render" -}}
{{- if typeIs "string" .value -}}
{{- tpl .value .context -}}
{{- else -}}
{{- tpl (.value | toYaml) .context -}}
{{- end -}}
{{- end -}}

{{/* An affinity preset that prints null when it is not chosen. */}}
{{- define "publicdb.affinityPreset" -}}
{{- if eq .type "soft" -}}
preferredDuringSchedulingIgnoredDuringExecution:
  - weight: 1
    podAffinityTerm:
      topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels: {{- include "publicdb.selectorLabels" .context | nindent 10 }}
{{- else -}}
null
{{- end -}}
{{- end -}}

{{- define "publicdb.image" -}}
{{- printf "%s/%s:%s" .Values.image.registry .Values.image.repository .Values.image.tag -}}
{{- end -}}
