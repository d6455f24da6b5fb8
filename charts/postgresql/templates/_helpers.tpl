{{/* Name of every object: the release name, cut to 63 characters. */}}
{{- define "postgresql.fullname" -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "postgresql.selectorLabels" -}}
app.kubernetes.io/name: postgresql
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "postgresql.labels" -}}
{{ include "postgresql.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "postgresql.secretName" -}}
{{- if .Values.auth.existingSecret -}}
{{ .Values.auth.existingSecret }}
{{- else -}}
{{ include "postgresql.fullname" . }}-auth
{{- end -}}
{{- end -}}

{{- define "postgresql.tlsSecretName" -}}
{{- .Values.tls.existingSecret | default (printf "%s-tls" (include "postgresql.fullname" .)) -}}
{{- end -}}

{{/* Directory of the PostgreSQL binaries in the image: image.binDir, or
Debian's layout for the tag's major (/usr/lib/postgresql/MAJOR/bin), which
the official image and Debian's packages share. */}}
{{- define "postgresql.binDir" -}}
{{- $major := index (splitList "." (toString .Values.image.tag | splitList "-" | first)) 0 -}}
{{- .Values.image.binDir | default (printf "/usr/lib/postgresql/%s/bin" $major) -}}
{{- end -}}
