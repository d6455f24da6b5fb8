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

{{/* The socket of the WAL service (the wal-agent container) that
archive_command and restore_command ask. */}}
{{- define "postgresql.walSocket" -}}
/var/run/postgresql/.chartpilot-wal
{{- end }}

{{/* The WAL service's command (chartpilot wal-serve in the wal-agent
container): walArchive's store flags, prefix and parallelism, as a JSON
list. Every word is checked against a plain set of characters
(credentials never go here). */}}
{{- define "postgresql.walServe" -}}
{{- $w := .Values.walArchive -}}
{{- $prefix := $w.prefix | default (printf "%s/%s" .Release.Namespace (include "postgresql.fullname" .)) -}}
{{- $words := list "/usr/local/bin/chartpilot" "wal-serve" (printf "--socket=%s" (include "postgresql.walSocket" .)) "--data-dir=/var/lib/postgresql/data/pgdata" (printf "--prefix=%s" $prefix) (printf "--parallel=%d" (int $w.parallel)) -}}
{{- range $w.storeArgs }}{{ $words = append $words (toString .) }}{{ end -}}
{{- range $words }}
{{- if not (regexMatch "^[A-Za-z0-9_./:=@+,-]+$" .) }}{{ fail (printf "walArchive: %q holds a character other than letters, digits and _./:=@+,- (storeArgs and prefix)" .) }}{{ end }}
{{- end -}}
{{ toJson $words }}
{{- end }}

{{/* The recover container's command: pod 0 alone runs the agent's
recover --new-cluster; the words are checked as walServe's are. */}}
{{- define "postgresql.recoverCommand" -}}
{{- $r := .Values.bootstrap.recovery -}}
{{- $fullname := include "postgresql.fullname" . -}}
{{- if not $r.prefix }}{{ fail "bootstrap.recovery.prefix: name the archive to recover from" }}{{ end -}}
{{- $words := list "/chartpilot/bin/chartpilot" "recover" (printf "--new-cluster=%s-primary" $fullname) "--data-dir=/var/lib/postgresql/data/pgdata" "--manifest-file=/dev/termination-log" (printf "--prefix=%s" $r.prefix) -}}
{{- range $r.storeArgs }}{{ $words = append $words (toString .) }}{{ end -}}
{{- with $r.targetTime }}{{ $words = append $words (printf "--target-time=%s" .) }}{{ end -}}
{{- with $r.targetLSN }}{{ $words = append $words (printf "--target-lsn=%s" .) }}{{ end -}}
{{- with $r.targetXID }}{{ $words = append $words (printf "--target-xid=%s" .) }}{{ end -}}
{{- range $words }}
{{- if not (regexMatch "^[A-Za-z0-9_./:=@+,-]+$" .) }}{{ fail (printf "bootstrap.recovery: %q holds a character other than letters, digits and _./:=@+,- (storeArgs, prefix and the target)" .) }}{{ end }}
{{- end -}}
{{ toJson (concat (list "sh" "-c" "case \"${HOSTNAME##*-}\" in 0) exec \"$@\";; esac; echo 'pod 0 alone recovers: this pod clones it'" "recover") $words) }}
{{- end }}

{{/* The replication role (failover.replicationUser) and its password, for
the clone and the primary that makes the role. Absent from an existing
Secret without the key: replicas then use the superuser. */}}
{{- define "postgresql.replicationEnv" -}}
{{- $u := .Values.failover.replicationUser | toString -}}
{{- if $u }}
{{- if or (not (regexMatch "^[a-z_][a-z0-9_]{0,62}$" $u)) (hasPrefix "pg_" $u) (eq $u .Values.auth.username) }}{{ fail (printf "failover.replicationUser %q: a role name of lower-case letters, digits and _, not pg_…, not the superuser (or empty: replicas use the superuser)" $u) }}{{ end }}
- {name: REPLICATION_USER, value: {{ $u | quote }}}
- name: REPLICATION_PASSWORD
  valueFrom: {secretKeyRef: {name: {{ include "postgresql.secretName" . }}, key: replication-password, optional: true}}
{{- end }}
{{- end -}}

{{/* The instance manager's port for the kubelet's probes (failover). */}}
{{- define "postgresql.healthPort" -}}
8008
{{- end -}}
