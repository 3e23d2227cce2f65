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

{{/* The Secret whose ca.crt signs the API server's webhook client certificate. */}}
{{- define "sharegpu.webhookClientSecretName" -}}
{{- if .Values.controller.webhook.clientAuth.existingSecret -}}
{{- .Values.controller.webhook.clientAuth.existingSecret -}}
{{- else -}}
{{- printf "%s-webhook-client" (include "sharegpu.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* Directory of the plugin's sockets, checkpoint and MPS directories on the host. */}}
{{- define "sharegpu.pluginDataDir" -}}
{{- printf "%s/plugins/%s" (trimSuffix "/" .Values.kubeletPlugin.kubeletDir) .Values.driverName }}
{{- end }}

{{- define "sharegpu.pluginRegistryDir" -}}
{{- printf "%s/plugins_registry" (trimSuffix "/" .Values.kubeletPlugin.kubeletDir) }}
{{- end }}

{{/*
The plugin's claim status writes (measured usage written into its claims' status.devices): "true"
or "". One condition for the RBAC grant (rbac-kubeletplugin.yaml), the policy that narrows it to
the plugin's node (claimstatus-policy.yaml) and the plugin's --usage-write-interval, so the grant
never exists without its policy.
*/}}
{{- define "sharegpu.pluginWritesClaimStatus" -}}
{{- $p := .Values.kubeletPlugin -}}
{{- if and $p.enabled $p.usage.enabled $p.usage.writeInterval .Values.resourceSlicePolicy.enabled -}}
true
{{- end -}}
{{- end }}

{{/*
The IPv4 address the plugin's /metrics and /healthz listen on; "" means the pod's IP. In the
node's network namespace (hostNetwork) the pod's IP is the node's, outside every NetworkPolicy,
so there an unset address is 127.0.0.1 (the schema refuses any other address there unless
kubeletPlugin.metrics.exposeOnNodeNetwork).
*/}}
{{- define "sharegpu.pluginMetricsAddress" -}}
{{- $p := .Values.kubeletPlugin -}}
{{- if $p.metrics.address -}}
{{- $p.metrics.address -}}
{{- else if $p.hostNetwork -}}
127.0.0.1
{{- end -}}
{{- end }}

{{/* Common container flags: logging. */}}
{{- define "sharegpu.loggingArgs" -}}
- --log-format={{ .Values.logging.format }}
- --log-level={{ .Values.logging.level }}
{{- end }}

{{/* Name of the MPS daemon pods (the plugin appends -<node name>-<12 hex digits of the claim
    and GPU>, the shape the -mps-pods policy requires; the plugin takes a template name of at
    most 41 characters). */}}
{{- define "sharegpu.mpsDaemonName" -}}
{{- printf "%s-mps" (include "sharegpu.fullname" .) | trunc 41 | trimSuffix "-" }}
{{- end }}

{{/* The PriorityClass of the MPS daemon pods: kubeletPlugin.mps.priorityClassName, else the
chart's own (templates/kubeletplugin-mps.yaml). */}}
{{- define "sharegpu.mpsPriorityClassName" -}}
{{- .Values.kubeletPlugin.mps.priorityClassName | default (printf "%s-daemon" (include "sharegpu.mpsDaemonName" .)) }}
{{- end }}

{{/* The host path of the driver files mounted into the driver-files init container (see
sharegpu.driverFilesVolumes), and where it is mounted. */}}
{{- define "sharegpu.driverHostPath" -}}
{{- $root := trimSuffix "/" .Values.kubeletPlugin.driverRoot -}}
{{- if eq $root "" }}/usr{{ else }}{{ $root }}{{ end -}}
{{- end }}

{{- define "sharegpu.driverMountPath" -}}
{{- if eq (trimSuffix "/" .Values.kubeletPlugin.driverRoot) "" }}/host-driver-root/usr{{ else }}/host-driver-root{{ end -}}
{{- end }}

{{/*
The driver-files init container of the plugin and the MPS daemon pods: builds a minimal driver
root in an emptyDir from the host's driver installation (only its usr/ directory is mounted,
read-only, with HostToContainer propagation so a driver root the GPU Operator mounts later is
seen): the NVIDIA tools and the libraries they and NVML need, and nothing else. Copied at every
pod start, so they match the loaded kernel module after a driver upgrade.
*/}}
{{- define "sharegpu.driverFilesInitContainer" -}}
- name: driver-files
  image: {{ include "sharegpu.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: ["sh", "-c"]
  args:
    - |
      src=/host-driver-root
      dest=/nvidia-root
      {{- if ne (trimSuffix "/" .Values.kubeletPlugin.driverRoot) "" }}
      # A driver container (GPU Operator) may mount its root after this pod started: wait for
      # NVML to appear (the mount propagates into this container) for up to 10 minutes.
      nvml_present() {
        for f in "$src"/usr/lib64/libnvidia-ml.so.1 "$src"/usr/lib/*-linux-gnu/libnvidia-ml.so.1 \
                 "$src"/usr/lib/libnvidia-ml.so.1; do
          [ -e "$f" ] && return 0
        done
        return 1
      }
      waited=0
      while ! nvml_present && [ "$waited" -lt 600 ]; do sleep 5; waited=$((waited + 5)); done
      {{- end }}
      mkdir -p "$dest/usr/bin" "$dest/usr/lib64"
      for name in nvidia-smi nvidia-cuda-mps-control nvidia-cuda-mps-server; do
        for dir in "$src/usr/bin"; do
          if [ -e "$dir/$name" ]; then cp -L "$dir/$name" "$dest/usr/bin/$name" || exit 1; break; fi
        done
      done
      for name in libnvidia-ml.so.1 libcuda.so.1 libnvidia-ptxjitcompiler.so.1; do
        for dir in "$src/usr/lib64" "$src/usr/lib/x86_64-linux-gnu" \
                   "$src/usr/lib/aarch64-linux-gnu" "$src/usr/lib"; do
          if [ -e "$dir/$name" ]; then cp -L "$dir/$name" "$dest/usr/lib64/$name" || exit 1; break; fi
        done
      done
      if [ ! -e "$dest/usr/lib64/libnvidia-ml.so.1" ]; then
        echo "libnvidia-ml.so.1 not found under the driver root {{ .Values.kubeletPlugin.driverRoot }}" \
          "(kubeletPlugin.driverRoot): is the NVIDIA driver installed on this node?" >&2
        exit 1
      fi
      ls -l "$dest/usr/bin" "$dest/usr/lib64"
  securityContext:
    runAsUser: 0
    runAsGroup: 0
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: ["ALL"]
      add: ["DAC_READ_SEARCH"]
  volumeMounts:
    - name: host-driver
      mountPath: {{ include "sharegpu.driverMountPath" . }}
      readOnly: true
      mountPropagation: HostToContainer
    - name: driver-files
      mountPath: /nvidia-root
{{- end }}

{{/* The volumes of the driver-files init container. */}}
{{- define "sharegpu.driverFilesVolumes" -}}
# A driver installed on the host (driverRoot /): only /usr, where its tools and libraries are.
# A driver container's root (e.g. the GPU Operator's /run/nvidia/driver): the root itself, since
# the driver container mounts it again after an upgrade and a mount of a subdirectory would keep
# the old one; it holds the driver container's files only.
- name: host-driver
  hostPath:
    path: {{ include "sharegpu.driverHostPath" . }}
    type: Directory
- name: driver-files
  emptyDir:
    sizeLimit: 1Gi
{{- end }}

{{/* Environment that puts the copied driver files first (plugin and MPS daemon). */}}
{{- define "sharegpu.driverFilesEnv" -}}
# NVML and the CUDA driver library, copied by the driver-files init container.
- name: LD_LIBRARY_PATH
  value: /nvidia-root/usr/lib64
# The NVIDIA tools on the PATH too, so the MPS control daemon finds its server binary.
- name: PATH
  value: /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/nvidia-root/usr/bin
{{- end }}
