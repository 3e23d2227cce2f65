{{/* Chart name, at most 63 characters. */}}
{{- define "sharegpu.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Prefix of every object name. */}}
{{- define "sharegpu.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "sharegpu.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "sharegpu.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "sharegpu.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "sharegpu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of one component ("kubelet-plugin" or "controller"). */}}
{{- define "sharegpu.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sharegpu.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "sharegpu.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "sharegpu.pluginName" -}}
{{- printf "%s-kubelet-plugin" (include "sharegpu.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sharegpu.controllerName" -}}
{{- printf "%s-controller" (include "sharegpu.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sharegpu.webhookServiceName" -}}
{{- printf "%s-webhook" (include "sharegpu.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sharegpu.webhookSecretName" -}}
{{- printf "%s-webhook-tls" (include "sharegpu.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Directory of the plugin's sockets, checkpoint and MPS directories on the host. */}}
{{- define "sharegpu.pluginDataDir" -}}
{{- printf "%s/plugins/%s" (trimSuffix "/" .Values.kubeletPlugin.kubeletDir) .Values.driverName }}
{{- end }}

{{- define "sharegpu.pluginRegistryDir" -}}
{{- printf "%s/plugins_registry" (trimSuffix "/" .Values.kubeletPlugin.kubeletDir) }}
{{- end }}

{{/* Common container flags: logging. */}}
{{- define "sharegpu.loggingArgs" -}}
- --log-format={{ .Values.logging.format }}
- --log-level={{ .Values.logging.level }}
{{- end }}
