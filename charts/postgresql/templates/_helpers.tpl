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

{{/* The agent's command line (without its file arguments) for
archive_command (wal-push) and restore_command (wal-fetch): walArchive's
store flags, prefix and, for wal-push, parallelism. Every word is checked
against a set of characters that needs no quoting in postgresql.conf or sh
(credentials never go here). Called with (list $ "wal-push"). */}}
{{- define "postgresql.walAgent" -}}
{{- $root := index . 0 -}}
{{- $cmd := index . 1 -}}
{{- $w := $root.Values.walArchive -}}
{{- $prefix := $w.prefix | default (printf "%s/%s" $root.Release.Namespace (include "postgresql.fullname" $root)) -}}
{{- $words := list "/chartpilot/bin/chartpilot" $cmd (printf "--prefix=%s" $prefix) -}}
{{- if eq $cmd "wal-push" }}{{ $words = append $words (printf "--parallel=%d" (int $w.parallel)) }}{{ end -}}
{{- range $w.storeArgs }}{{ $words = append $words (toString .) }}{{ end -}}
{{- range $words }}
{{- if not (regexMatch "^[A-Za-z0-9_./:=@+,-]+$" .) }}{{ fail (printf "walArchive: %q holds a character other than letters, digits and _./:=@+,- (storeArgs and prefix go into archive_command)" .) }}{{ end }}
{{- end -}}
{{ join " " $words }}
{{- end }}
