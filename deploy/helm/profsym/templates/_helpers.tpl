{{/*
Names. Objects are <fullname>-<component>; fullname is the release name
unless fullnameOverride is set, truncated so that the longest suffix
("-gateway-headless") keeps names within 63 characters.
*/}}
{{- define "profsym.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "profsym.fullname" -}}
{{- default .Release.Name .Values.fullnameOverride | trunc 45 | trimSuffix "-" }}
{{- end }}

{{- define "profsym.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "profsym.agentName" -}}
{{- include "profsym.fullname" . }}-agent
{{- end }}

{{- define "profsym.gatewayName" -}}
{{- include "profsym.fullname" . }}-gateway
{{- end }}

{{- define "profsym.gatewayHeadlessName" -}}
{{- include "profsym.fullname" . }}-gateway-headless
{{- end }}

{{- define "profsym.cacheClaimName" -}}
{{- if .Values.gateway.cache.persistence.existingClaim }}
{{- .Values.gateway.cache.persistence.existingClaim }}
{{- else }}
{{- include "profsym.fullname" . }}-gateway-cache
{{- end }}
{{- end }}

{{- define "profsym.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "profsym.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The agent's ServiceAccount: its own when it reads the API
(kubernetesMetadata), so that the gateway's and the store's pods hold no
right to it; the shared one otherwise.
*/}}
{{- define "profsym.agentServiceAccountName" -}}
{{- if and .Values.kubernetesMetadata.enabled .Values.serviceAccount.create }}
{{- default (include "profsym.agentName" .) .Values.serviceAccount.agentName }}
{{- else if .Values.kubernetesMetadata.enabled }}
{{- default (include "profsym.serviceAccountName" .) .Values.serviceAccount.agentName }}
{{- else }}
{{- include "profsym.serviceAccountName" . }}
{{- end }}
{{- end }}

{{/* Cluster-scoped names carry the namespace: release names repeat across namespaces. */}}
{{- define "profsym.agentClusterRoleName" -}}
{{- printf "%s-%s" .Release.Namespace (include "profsym.agentName" .) }}
{{- end }}

{{/*
Labels. Call with (dict "ctx" $ "component" "agent").
*/}}
{{- define "profsym.selectorLabels" -}}
app.kubernetes.io/name: {{ include "profsym.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end }}

{{- define "profsym.labels" -}}
helm.sh/chart: {{ include "profsym.chart" .ctx }}
{{ include "profsym.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: profsym
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "profsym.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{- define "profsym.args" -}}
- --config=/etc/profsym/config.yaml
{{- if .Values.featureGates }}
- --feature-gates={{ join "," .Values.featureGates }}
{{- end }}
{{- end }}

{{/*
The address the agents export to. round_robin needs every gateway pod's
address, which only a headless Service's DNS name gives; pick_first goes
through the ClusterIP Service.
*/}}
{{- define "profsym.gatewayEndpoint" -}}
{{- $g := .Values.agent.exporter }}
{{- if $g.endpoint }}
{{- $g.endpoint }}
{{- else if eq $g.balancer "round_robin" }}
{{- printf "dns:///%s.%s.svc.%s:%d" (include "profsym.gatewayHeadlessName" .) .Release.Namespace .Values.clusterDomain (int .Values.gateway.service.grpcPort) }}
{{- else }}
{{- printf "%s:%d" (include "profsym.gatewayName" .) (int .Values.gateway.service.grpcPort) }}
{{- end }}
{{- end }}

{{/*
Probes on the health_check extension. Call with the probe's values.
*/}}
{{- define "profsym.probe" -}}
httpGet:
  path: /
  port: health
initialDelaySeconds: {{ .initialDelaySeconds }}
periodSeconds: {{ .periodSeconds }}
timeoutSeconds: {{ .timeoutSeconds }}
failureThreshold: {{ .failureThreshold }}
{{- end }}

{{/*
Collector self-telemetry and extensions, shared by both configurations.
*/}}
{{/*
Symbol upload and store (symbols.enabled): always behind a token (given,
or generated: symbols-token-secret.yaml), and the Secret holding it.
*/}}
{{- define "profsym.symbolsAuth" -}}
{{- if .Values.symbols.enabled }}true{{ end }}
{{- end }}

{{- define "profsym.symbolsTokenSecret" -}}
{{- default (printf "%s-symbols-token" (include "profsym.fullname" .)) .Values.symbols.token.existingSecret }}
{{- end }}

{{/*
Where the symbol store runs: "statefulset" (one pod owning a volume; the
gateways read it over HTTP) or "s3" (every gateway replica over a bucket);
empty when symbols are off.
*/}}
{{- define "profsym.symbolsMode" -}}
{{- if .Values.symbols.enabled }}{{ ternary "s3" "statefulset" (ne .Values.symbols.store.s3.bucket "") }}{{ end }}
{{- end }}

{{- define "profsym.symbolsName" -}}
{{- include "profsym.fullname" . }}-symbols
{{- end }}

{{/* The store's URL, for agents' uploads (and, with the StatefulSet, gateways' reads). */}}
{{- define "profsym.symbolsURL" -}}
{{- $svc := ternary (include "profsym.gatewayName" .) (include "profsym.symbolsName" .) (eq (include "profsym.symbolsMode" .) "s3") }}
{{- printf "%s://%s.%s.svc.%s:%d" (ternary "https" "http" .Values.tls.enabled) $svc .Release.Namespace .Values.clusterDomain (int .Values.symbols.store.port) }}
{{- end }}

{{/* Where the token Secret is mounted in both workloads. */}}
{{- define "profsym.symbolsTokenDir" -}}/etc/profsym-symbols{{- end }}

{{- define "profsym.telemetry" -}}
telemetry:
  logs:
    level: {{ .Values.telemetry.logLevel }}
  metrics:
    level: {{ .Values.telemetry.metricsLevel }}
    readers:
      - pull:
          exporter:
            prometheus:
              host: ${env:MY_POD_IP}
              port: {{ int .Values.telemetry.metricsPort }}
extensions:
  - health_check
  {{- if .Values.pprof.enabled }}
  - pprof
  {{- end }}
  {{- if include "profsym.symbolsAuth" . }}
  - bearertokenauth/symbols
  {{- end }}
{{- end }}

{{- define "profsym.extensions" -}}
health_check:
  endpoint: ${env:MY_POD_IP}:{{ int .Values.healthCheck.port }}
{{- if .Values.pprof.enabled }}
pprof:
  endpoint: localhost:{{ int .Values.pprof.port }}
{{- end }}
{{- if include "profsym.symbolsAuth" . }}
bearertokenauth/symbols:
  filename: {{ include "profsym.symbolsTokenDir" . }}/token
{{- end }}
{{- end }}

{{/*
Merges or replaces a generated configuration with the user's. Call with
(dict "base" YAML-string "mode" "merge|replace" "override" map).
*/}}
{{- define "profsym.mergeConfig" -}}
{{- if eq .mode "replace" }}
{{- if not .override }}
{{- fail "configMode replace needs a non-empty config" }}
{{- end }}
{{- toYaml .override }}
{{- else }}
{{- $base := fromYaml .base }}
{{- if hasKey $base "Error" }}
{{- fail (printf "internal error rendering the collector configuration: %s" (get $base "Error")) }}
{{- end }}
{{- toYaml (mustMergeOverwrite $base (deepCopy (default (dict) .override))) }}
{{- end }}
{{- end }}

{{- define "profsym.podIPEnv" -}}
- name: MY_POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- end }}
