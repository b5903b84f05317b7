{{- define "epochal.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "epochal.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "epochal.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "epochal.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "epochal.selectorLabels" -}}
app.kubernetes.io/name: {{ include "epochal.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "epochal.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "epochal.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "epochal.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{- define "epochal.jobsNamespace" -}}
{{- .Values.jobs.namespace | default .Release.Namespace -}}
{{- end -}}

{{- define "epochal.settingsSecret" -}}
{{- .Values.existingSecret | default (printf "%s-settings" (include "epochal.fullname" .)) -}}
{{- end -}}

{{- define "epochal.storeSecret" -}}
{{- if .Values.store.existingSecret -}}
{{- .Values.store.existingSecret -}}
{{- else if .Values.store.accessKeyId -}}
{{- printf "%s-store" (include "epochal.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* Environment shared by every control-plane container. */}}
{{- define "epochal.envFrom" -}}
- configMapRef:
    name: {{ include "epochal.fullname" . }}-settings
- secretRef:
    name: {{ include "epochal.settingsSecret" . }}
{{- with include "epochal.storeSecret" . }}
- secretRef:
    name: {{ . }}
{{- end }}
{{- end -}}

{{/* Pod-level settings shared by every control-plane Pod. */}}
{{- define "epochal.podSpec" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
securityContext:
  runAsNonRoot: true
  runAsUser: 10001
  runAsGroup: 0
  fsGroup: 0
{{- with .Values.nodeSelector }}
nodeSelector:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "epochal.containerSecurityContext" -}}
allowPrivilegeEscalation: false
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* The Secret holding EPOCHAL_METRICS_TOKEN, the bearer token of the ServiceMonitor. */}}
{{- define "epochal.metricsSecret" -}}
{{- .Values.metrics.tokenSecret | default (printf "%s-metrics" (include "epochal.fullname" .)) -}}
{{- end -}}
