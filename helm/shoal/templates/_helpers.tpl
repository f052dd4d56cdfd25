{{/* Names and labels shared by every template. */}}

{{- define "shoal.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's base name; objects add -agent, -tracker... (kept short for DNS labels). */}}
{{- define "shoal.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "shoal.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "shoal.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component (agent, tracker, node-cleanup). */}}
{{- define "shoal.selectorLabels" -}}
app.kubernetes.io/name: {{ include "shoal.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "shoal.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "shoal.trackerName" -}}
{{- printf "%s-tracker" (include "shoal.fullname" .) -}}
{{- end -}}

{{/* Every tracker replica's stable URL, comma-separated (StatefulSet pod names through the
     headless Service): the agents' rendezvous hashing needs all of them, in a fixed order. */}}
{{- define "shoal.trackerUrls" -}}
{{- $name := include "shoal.trackerName" . -}}
{{- $urls := list -}}
{{- range $i := until (int .Values.tracker.replicas) -}}
{{- $urls = append $urls (printf "http://%s-%d.%s.%s.svc:%d" $name $i $name $.Release.Namespace (int $.Values.tracker.port)) -}}
{{- end -}}
{{- join "," $urls -}}
{{- end -}}

{{/* The shim address the node's runtimes use: HOST:PORT (NODE_IP is the pod's env var). */}}
{{- define "shoal.shimAddress" -}}
{{- if eq .Values.agent.shim.bind "hostIP" -}}
{{- printf "$(NODE_IP):%d" (int .Values.agent.shim.port) -}}
{{- else -}}
{{- printf "127.0.0.1:%d" (int .Values.agent.shim.port) -}}
{{- end -}}
{{- end -}}

{{/* The agent's containerd snapshotter on the host (agent.snapshotter): its socket and its
     snapshots' directory, both mounted at the same paths in the agent. */}}
{{- define "shoal.snapshotterSocket" -}}
{{- printf "%s/snapshotter.sock" .Values.agent.snapshotter.socketDir -}}
{{- end -}}
{{- define "shoal.snapshotterRoot" -}}
{{- default (printf "%s/snapshotter" .Values.agent.cache.hostPath) .Values.agent.snapshotter.hostPath -}}
{{- end -}}

{{/* Registries that node setup sends through the agent. */}}
{{- define "shoal.registries" -}}
{{- if .Values.nodeSetup.registries -}}
{{- join "," .Values.nodeSetup.registries -}}
{{- else -}}
{{- join "," (keys .Values.upstreams.map | sortAlpha) -}}
{{- end -}}
{{- end -}}

{{- define "shoal.credentialsSecret" -}}
{{- if .Values.credentials.existingSecret -}}
{{- .Values.credentials.existingSecret -}}
{{- else if .Values.credentials.dockerConfigJson -}}
{{- printf "%s-upstream-credentials" (include "shoal.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "shoal.credentialsKey" -}}
{{- if .Values.credentials.existingSecret -}}
{{- .Values.credentials.existingSecretKey -}}
{{- else -}}
.dockerconfigjson
{{- end -}}
{{- end -}}

{{/* The Secret with the cluster's tokens (agent-token, agent-tokens, operator-token,
     operator-tokens): auth.existingSecret, or the one the chart creates. */}}
{{- define "shoal.authSecret" -}}
{{- default (printf "%s-cluster-credentials" (include "shoal.fullname" .)) .Values.auth.existingSecret -}}
{{- end -}}

{{/* Where the token files are mounted (a Secret volume with items, never subPath: kubelet
     updates those files in place, and agent and tracker re-read them). */}}
{{- define "shoal.tokenDir" -}}
/etc/shoal/tokens
{{- end -}}

{{/* The upstream map file (--upstream-map-file). */}}
{{- define "shoal.upstreamMap" -}}
{{- dict "upstreams" .Values.upstreams.map "unmapped" .Values.upstreams.unmapped | toPrettyJson -}}
{{- end -}}

{{/* node-setup flags for the host paths that are enabled (shared by setup and cleanup). */}}
{{- define "shoal.nodeSetupArgs" -}}
- --root=/host
- --agent={{ include "shoal.shimAddress" . }}
- --registry={{ include "shoal.registries" . }}
{{- if .Values.nodeSetup.containerd.enabled }}
- --containerd-certs-dir={{ .Values.nodeSetup.containerd.certsDir }}
- --containerd-config={{ .Values.nodeSetup.containerd.configToml }}
{{- end }}
{{- if .Values.nodeSetup.crio.enabled }}
- --crio-drop-in={{ .Values.nodeSetup.crio.dropIn }}
{{- end }}
{{- if .Values.nodeSetup.dockerd.enabled }}
- --dockerd-config={{ .Values.nodeSetup.dockerd.daemonJson }}
- --dockerd-pid-file={{ .Values.nodeSetup.dockerd.pidFile }}
{{- end }}
{{- end -}}

{{/* Host mounts: / read-only at /host, and writable mounts for the files node setup writes. */}}
{{- define "shoal.hostVolumeMounts" -}}
- name: host-root
  mountPath: /host
  readOnly: true
  mountPropagation: HostToContainer
{{- if .Values.nodeSetup.containerd.enabled }}
- name: containerd-certs
  mountPath: {{ printf "/host%s" .Values.nodeSetup.containerd.certsDir }}
{{- end }}
{{- if .Values.nodeSetup.crio.enabled }}
- name: crio-drop-ins
  mountPath: {{ printf "/host%s" (dir .Values.nodeSetup.crio.dropIn) }}
{{- end }}
{{- if .Values.nodeSetup.dockerd.enabled }}
- name: docker-config
  mountPath: {{ printf "/host%s" (dir .Values.nodeSetup.dockerd.daemonJson) }}
{{- end }}
{{- end -}}

{{- define "shoal.hostVolumes" -}}
- name: host-root
  hostPath:
    path: /
    type: Directory
{{- if .Values.nodeSetup.containerd.enabled }}
- name: containerd-certs
  hostPath:
    path: {{ .Values.nodeSetup.containerd.certsDir }}
    type: DirectoryOrCreate
{{- end }}
{{- if .Values.nodeSetup.crio.enabled }}
- name: crio-drop-ins
  hostPath:
    path: {{ dir .Values.nodeSetup.crio.dropIn }}
    type: DirectoryOrCreate
{{- end }}
{{- if .Values.nodeSetup.dockerd.enabled }}
- name: docker-config
  hostPath:
    path: {{ dir .Values.nodeSetup.dockerd.daemonJson }}
    type: DirectoryOrCreate
{{- end }}
{{- end -}}

{{/* The node-setup container's security: root (it writes root-owned host files), no
     privilege, only the capabilities it needs (KILL to SIGHUP dockerd). */}}
{{- define "shoal.nodeSetupSecurityContext" -}}
runAsUser: 0
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
  {{- if .Values.nodeSetup.dockerd.enabled }}
  add: [KILL, DAC_OVERRIDE, CHOWN, FOWNER]
  {{- else }}
  add: [DAC_OVERRIDE, CHOWN, FOWNER]
  {{- end }}
{{- end -}}

{{/* A map as KEY=VALUE,KEY=VALUE, sorted by key. */}}
{{- define "shoal.kvList" -}}
{{- $out := list -}}
{{- range $k, $v := . -}}
{{- $out = append $out (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}
