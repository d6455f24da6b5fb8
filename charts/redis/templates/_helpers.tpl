{{- define "redis.selectorLabels" -}}
app.kubernetes.io/name: redis
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "redis.labels" -}}
{{ include "redis.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "redis.podSpec" -}}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  runAsNonRoot: true
  runAsUser: 999
  fsGroup: 999
  seccompProfile:
    type: RuntimeDefault
containers:
  - name: redis
    image: {{ printf "%s:%s" .Values.image.repository .Values.image.tag | quote }}
    imagePullPolicy: {{ .Values.image.pullPolicy | quote }}
    # extraArgs reach redis-server as arguments of their own ("$@"), never
    # as shell text: nothing in them is expanded or run.
    command: ["sh", "-c"]
    args:
      - exec redis-server --port {{ int .Values.service.port }} --dir /data{{ if .Values.auth.enabled }} --requirepass "$REDIS_PASSWORD"{{ end }} "$@"
      - redis-server
      {{- range .Values.extraArgs }}
      - {{ . | toJson }}
      {{- end }}
    {{- if .Values.auth.enabled }}
    env:
      - name: REDIS_PASSWORD
        valueFrom: {secretKeyRef: {name: {{ .Release.Name }}-auth, key: password}}
    {{- end }}
    ports:
      - {name: redis, containerPort: {{ int .Values.service.port }}}
    readinessProbe:
      tcpSocket: {port: redis}
      periodSeconds: 5
    livenessProbe:
      tcpSocket: {port: redis}
      periodSeconds: 10
    resources:
      {{- toYaml .Values.resources | nindent 6 }}
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities: {drop: ["ALL"]}
    volumeMounts:
      - {name: data, mountPath: /data}
  {{- if .Values.metrics.enabled }}
  - name: metrics
    image: {{ printf "%s:%s" .Values.metrics.image.repository .Values.metrics.image.tag | quote }}
    env:
      - {name: REDIS_ADDR, value: {{ printf "redis://localhost:%d" (int .Values.service.port) | quote }}}
      {{- if .Values.auth.enabled }}
      - name: REDIS_PASSWORD
        valueFrom: {secretKeyRef: {name: {{ .Release.Name }}-auth, key: password}}
      {{- end }}
    ports:
      - {name: metrics, containerPort: {{ int .Values.metrics.port }}}
    resources:
      {{- toYaml .Values.metrics.resources | nindent 6 }}
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities: {drop: ["ALL"]}
  {{- end }}
{{- if not .Values.persistence.enabled }}
volumes:
  - {name: data, emptyDir: {}}
{{- end }}
{{- end -}}
