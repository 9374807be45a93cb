{{- define "dllm-operator.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dllm-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "dllm-operator.labels" -}}
app.kubernetes.io/name: {{ include "dllm-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "dllm-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dllm-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* REGISTRY/dllm-NAME:TAG, TAG defaulting to the chart's appVersion; call with (list . "engine") */}}
{{- define "dllm-operator.image" -}}
{{- $root := index . 0 -}}
{{- printf "%s/dllm-%s:%s" (trimSuffix "/" $root.Values.image.registry) (index . 1) ($root.Values.image.tag | default $root.Chart.AppVersion) -}}
{{- end -}}

{{- define "dllm-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "dllm-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The names of .Values.imagePullSecrets, comma-separated: what the operator gives every pod it creates */}}
{{- define "dllm-operator.pullSecretNames" -}}
{{- range $i, $secret := .Values.imagePullSecrets -}}
{{- if $i }},{{ end }}{{ $secret.name }}
{{- end -}}
{{- end -}}
