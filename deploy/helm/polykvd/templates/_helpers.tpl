{{/* The resources' name: the release's, which is "polykvd" for the manifests in deploy/k8s. */}}
{{- define "polykvd.name" -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels the DaemonSet selects its pods by (and the Service its endpoints). */}}
{{- define "polykvd.selectorLabels" -}}
app.kubernetes.io/name: polykvd
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "polykvd.labels" -}}
{{ include "polykvd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The daemon's config: the value's text, else deploy/polykvd.yaml. */}}
{{- define "polykvd.config" -}}
{{- .Values.config | default (.Files.Get "files/polykvd.yaml") -}}
{{- end -}}
