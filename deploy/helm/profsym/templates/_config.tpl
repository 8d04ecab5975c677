{{/*
The agent's collector configuration: profiling receiver -> memory_limiter ->
OTLP/gRPC to the gateway. No symbolization on the node: frames leave as
(build id, address) and the gateway resolves them.
*/}}
{{- define "profsym.agent.baseConfig" -}}
{{- $a := .Values.agent -}}
{{- $p := $a.profiling -}}
extensions:
  {{- include "profsym.extensions" . | nindent 2 }}
receivers:
  profiling:
    sample_rate: {{ int $p.sampleRate }}
    max_stack_depth: {{ int $p.maxStackDepth }}
    report_interval: {{ $p.reportInterval }}
    kernel_stacks: {{ $p.kernelStacks }}
    kernel_symbols: {{ $p.kernelSymbols }}
    perf_maps: {{ $p.perfMaps }}
    {{- with $p.targets }}
    {{- range . }}
    {{- if and (kindIs "map" .) (hasKey . "kubernetes") (not $.Values.kubernetesMetadata.enabled) }}
    {{- fail "agent.profiling.targets: a kubernetes target needs kubernetesMetadata.enabled (the agent's API token and its ClusterRole on pods)" }}
    {{- end }}
    {{- end }}
    targets:
      {{- toYaml . | nindent 6 }}
    {{- end }}
processors:
  memory_limiter:
    check_interval: 1s
    {{- $avail := include "profsym.agent.memoryAvailable" . | int64 }}
    {{- if $avail }}
    # limitPercentage and spikeLimitPercentage of the memory limit less
    # agent.bpfMemory: the limiter does not see the BPF maps.
    limit_mib: {{ div (mul $avail (int $a.memoryLimiter.limitPercentage)) 104857600 }}
    spike_limit_mib: {{ div (mul $avail (int $a.memoryLimiter.spikeLimitPercentage)) 104857600 }}
    {{- else }}
    limit_percentage: {{ int $a.memoryLimiter.limitPercentage }}
    spike_limit_percentage: {{ int $a.memoryLimiter.spikeLimitPercentage }}
    {{- end }}
  {{- if .Values.kubernetesMetadata.enabled }}
  {{- include "profsym.agent.k8sAttributes" . | nindent 2 }}
  {{- end }}
  {{- if .Values.symbols.enabled }}
  {{- $u := $a.symbolUpload }}
  symbolupload:
    endpoint: {{ include "profsym.symbolsURL" . }}
    {{- if include "profsym.symbolsAuth" . }}
    auth:
      authenticator: bearertokenauth/symbols
    {{- end }}
    {{- if include "profsym.tls" . }}
    {{- include "profsym.clientTLS" . | nindent 4 }}
    {{- end }}
    debug_directories: {{ toYaml $u.debugDirectories | nindent 6 }}
    exclude: {{ toYaml $u.exclude | nindent 6 }}
    max_bandwidth: {{ int64 $u.maxBandwidth }}
    max_concurrent_uploads: {{ int $u.maxConcurrentUploads }}
    scratch_directory: /var/tmp/profsym-symbols
  {{- end }}
exporters:
  otlp_grpc:
    endpoint: ${env:PROFSYM_GATEWAY_ENDPOINT}
    balancer_name: {{ $a.exporter.balancer }}
    compression: {{ $a.exporter.compression }}
    timeout: {{ $a.exporter.timeout }}
    {{- if include "profsym.tls" . }}
    {{- include "profsym.clientTLS" . | nindent 4 }}
    {{- else }}
    tls:
      insecure: {{ $a.exporter.insecure }}
    {{- end }}
    {{- if include "profsym.gatewayAuth" . }}
    # The gateway's intake token (gateway.auth), from the pod's env: a
    # header rather than bearertokenauth, whose gRPC credentials need TLS.
    headers:
      authorization: Bearer ${env:PROFSYM_GATEWAY_TOKEN}
    {{- end }}
    sending_queue:
      enabled: true
      queue_size: {{ int $a.exporter.queueSize }}
    # Keep retrying while the gateway restarts or scales; the bounded queue
    # refuses new reports (counted as failed reports) instead of growing.
    retry_on_failure:
      enabled: true
      initial_interval: 1s
      max_interval: 30s
      max_elapsed_time: 0
service:
  {{- include "profsym.telemetry" . | nindent 2 }}
  pipelines:
    profiles:
      receivers: [profiling]
      processors: [memory_limiter{{ if .Values.kubernetesMetadata.enabled }}, k8s_attributes{{ end }}{{ if .Values.symbols.enabled }}, symbolupload{{ end }}]
      exporters: [otlp_grpc]
    {{- if $a.profileEvents.enabled }}
    logs:
      receivers: [profiling]
      processors: [memory_limiter{{ if .Values.kubernetesMetadata.enabled }}, k8s_attributes{{ end }}]
      exporters: [otlp_grpc]
    {{- end }}
{{- end }}

{{/*
The agent's k8s_attributes processor (kubernetesMetadata): pods of this
node only, joined by what the receiver read from each process's cgroup.
The pod UID comes first: it is known as soon as the pod's cgroup exists,
while a container's id reaches the pod's status only once it runs. The
processor tries the first association whose attributes a resource has and
no other, and static pods (whose cgroup names no API UID) have only
container.id, so both are listed. Deployment names come from the
ReplicaSet's name, statefulset and daemonset names from owner references:
watching pods is all these need (namespaces and replicasets in the
ClusterRole serve namespace labels and deployment UIDs added through
agent.config).
*/}}
{{- define "profsym.agent.k8sAttributes" -}}
k8s_attributes:
  auth_type: serviceAccount
  passthrough: false
  filter:
    node_from_env_var: K8S_NODE_NAME
  pod_association:
    - sources:
        - from: resource_attribute
          name: k8s.pod.uid
    - sources:
        - from: resource_attribute
          name: container.id
  extract:
    metadata:
      - k8s.namespace.name
      - k8s.pod.name
      - k8s.pod.uid
      - k8s.node.name
      - k8s.container.name
      - k8s.deployment.name
      - k8s.replicaset.name
      - k8s.statefulset.name
      - k8s.daemonset.name
      - k8s.job.name
      - k8s.cronjob.name
{{- end }}

{{/*
The gateway's collector configuration: OTLP in -> memory_limiter ->
symbolization -> file and/or the backend.
*/}}
{{- define "profsym.gateway.symbolization" -}}
{{- $s := .s -}}
{{- $sources := $s.sources -}}
{{- if and .store (not (has "symbol_store" $sources)) }}{{ $sources = prepend $sources "symbol_store" }}{{ end -}}
sources:
  {{- toYaml $sources | nindent 2 }}
{{- if .store }}
symbol_store: symbolstore
{{- end }}
debug_directories: {{ toYaml $s.debugDirectories | nindent 2 }}
symbol_directories: {{ toYaml $s.symbolDirectories | nindent 2 }}
demangle: {{ $s.demangle }}
inline_frames: {{ $s.inlineFrames }}
line_numbers: {{ $s.lineNumbers }}
timeout: {{ $s.timeout }}
{{- with $s.fetchWait }}
fetch_wait: {{ . }}
{{- end }}
negative_ttl: {{ $s.negativeTTL }}
{{- $m := .memory }}
# Sized for the container's memory limit (docs/deployment.md#gateway-memory).
cache:
  {{- range $key, $v := dict "max_bytes" $m.maxBytes "max_result_bytes" $m.maxResultBytes "max_objects" $m.maxObjects "max_demangled_bytes" $m.maxDemangledBytes }}
  {{- if $v }}
  {{ $key }}: {{ int64 $v }}
  {{- end }}
  {{- end }}
  max_entries: {{ int64 $s.cache.maxEntries }}
limits:
  max_file_bytes: {{ int64 $s.limits.maxFileBytes }}
  {{- if $m.maxDecompressedBytes }}
  max_decompressed_bytes: {{ int64 $m.maxDecompressedBytes }}
  {{- end }}
  max_name_bytes: {{ int64 $s.limits.maxNameBytes }}
  max_attribute_bytes: {{ int64 $s.limits.maxAttributeBytes }}
debuginfod:
  # urls stay empty: the processor reads DEBUGINFOD_URLS.
  cache_dir: {{ .cacheDir }}
  timeout: {{ $s.debuginfod.timeout }}
  max_cache_bytes: {{ int64 $s.debuginfod.maxCacheBytes }}
  max_parallel: {{ int $s.debuginfod.maxParallel }}
  negative_ttl: {{ $s.debuginfod.negativeTTL }}
  max_file_bytes: {{ int64 $s.debuginfod.maxFileBytes }}
  max_download_time: {{ $s.debuginfod.maxDownloadTime }}
{{- end }}

{{- define "profsym.gateway.exporterNames" -}}
{{- $g := .Values.gateway -}}
{{- $e := list -}}
{{- if $g.fileOutput.enabled }}{{ $e = append $e "file" }}{{ end -}}
{{- if $g.backend.endpoint }}{{ $e = append $e (printf "otlp_%s/backend" $g.backend.protocol) }}{{ end -}}
{{- if not $e }}{{ fail "gateway: nothing to export to: enable gateway.fileOutput or set gateway.backend.endpoint" }}{{ end -}}
{{- toJson $e -}}
{{- end }}

{{- define "profsym.gateway.baseConfig" -}}
{{- $g := .Values.gateway -}}
{{- $exporters := include "profsym.gateway.exporterNames" . -}}
{{- $sym := $g.symbolization -}}
{{- $cacheDir := printf "%s/debuginfod" (trimSuffix "/" $g.cache.mountPath) -}}
extensions:
  {{- include "profsym.extensions" . | nindent 2 }}
  {{- $st := .Values.symbols.store }}
  {{- if eq (include "profsym.symbolsMode" .) "s3" }}
  symbolstore:
    endpoint: ${env:PROFSYM_SYMBOLS_LISTEN}
    {{- if include "profsym.symbolsAuth" . }}
    auth:
      authenticator: bearertokenauth/symbols
    {{- end }}
    {{- if include "profsym.tls" . }}
    {{- include "profsym.serverTLS" . | nindent 4 }}
    {{- end }}
    max_upload_size: {{ int64 $st.maxUploadSize }}
    lease_duration: {{ $st.leaseDuration }}
    {{- with $st.maxStoredBytes }}
    max_stored_bytes: {{ int64 . }}
    {{- end }}
    max_objects: {{ int64 $st.maxObjects }}
    storage:
      s3:
        endpoint: {{ required "symbols.store.s3.endpoint is required with a bucket" $st.s3.endpoint | quote }}
        bucket: {{ $st.s3.bucket | quote }}
        prefix: {{ $st.s3.prefix | quote }}
        region: {{ $st.s3.region | quote }}
        access_key_id: ${env:PROFSYM_SYMBOLS_S3_ACCESS_KEY}
        secret_access_key: ${env:PROFSYM_SYMBOLS_S3_SECRET_KEY}
        insecure: {{ $st.s3.insecure }}
        create_bucket: {{ $st.s3.createBucket }}
      scratch_directory: {{ include "profsym.gatewaySymbolsDir" . }}
      cache_max_bytes: {{ int64 $st.cacheMaxBytes }}
      rescan: {{ $st.rescan }}
  {{- else if eq (include "profsym.symbolsMode" .) "statefulset" }}
  # Reads the symbols StatefulSet's store over HTTP; serves nothing here.
  symbolstore:
    storage:
      remote:
        endpoint: {{ include "profsym.symbolsURL" . }}
        {{- if include "profsym.symbolsAuth" . }}
        auth:
          authenticator: bearertokenauth/symbols
        {{- end }}
        {{- if include "profsym.tls" . }}
        {{- include "profsym.clientTLS" . | nindent 8 }}
        {{- end }}
      scratch_directory: {{ include "profsym.gatewaySymbolsDir" . }}
      cache_max_bytes: {{ int64 $st.cacheMaxBytes }}
      rescan: {{ $st.rescan }}
  {{- end }}
  {{- if include "profsym.jfrAuth" . }}
  {{- include "profsym.gateway.jfrExtension" . | nindent 2 }}
  {{- end }}
  {{- if include "profsym.gatewayAuth" . }}
  # The intakes' token (gateway.auth).
  bearertokenauth/intake:
    filename: {{ include "profsym.gatewayTokenDir" . }}/token
  {{- end }}
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: ${env:PROFSYM_GATEWAY_LISTEN:-0.0.0.0:4317}
        {{- include "profsym.gateway.intakeSecurity" . | nindent 8 }}
        max_recv_msg_size_mib: {{ int $g.maxRecvMsgSizeMiB }}
        keepalive:
          server_parameters:
            max_connection_age: {{ $g.maxConnectionAge }}
            max_connection_age_grace: {{ $g.maxConnectionAgeGrace }}
      http:
        endpoint: ${env:PROFSYM_GATEWAY_HTTP_LISTEN:-0.0.0.0:4318}
        {{- include "profsym.gateway.intakeSecurity" . | nindent 8 }}
  {{- if $g.jfr.enabled }}
  {{- include "profsym.gateway.jfrReceiver" . | nindent 2 }}
  {{- end }}
processors:
  memory_limiter:
    check_interval: 1s
    limit_percentage: {{ int $g.memoryLimiter.limitPercentage }}
    spike_limit_percentage: {{ int $g.memoryLimiter.spikeLimitPercentage }}
  symbolization:
    {{- include "profsym.gateway.symbolization" (dict "s" $sym "cacheDir" $cacheDir "store" .Values.symbols.enabled "memory" (include "profsym.gateway.memory" . | fromJson)) | nindent 4 }}
exporters:
  {{- if $g.fileOutput.enabled }}
  file:
    path: ${env:PROFSYM_OUTPUT}
    format: json
    rotation:
      max_megabytes: {{ int $g.fileOutput.maxMegabytes }}
      max_backups: {{ int $g.fileOutput.maxBackups }}
  {{- end }}
  {{- with $g.backend }}
  {{- if .endpoint }}
  otlp_{{ .protocol }}/backend:
    endpoint: ${env:PROFSYM_BACKEND_ENDPOINT}
    compression: {{ .compression }}
    tls:
      insecure: {{ .insecure }}
    {{- with .headers }}
    headers:
      {{- toYaml . | nindent 6 }}
    {{- end }}
  {{- end }}
  {{- end }}
service:
  {{- include "profsym.telemetry" . | nindent 2 }}
  {{- if .Values.symbols.enabled }}
    - symbolstore
  {{- end }}
  {{- if include "profsym.jfrAuth" . }}
    - bearertokenauth/jfr
  {{- end }}
  {{- if include "profsym.gatewayAuth" . }}
    - bearertokenauth/intake
  {{- end }}
  pipelines:
    profiles:
      receivers: [otlp{{ if $g.jfr.enabled }}, jfr{{ end }}]
      processors: [memory_limiter, symbolization]
      exporters: {{ $exporters }}
    {{- if $g.profileEvents.enabled }}
    logs:
      receivers: [otlp]
      # The same processor: profiles and logs share its caches.
      processors: [memory_limiter, symbolization]
      exporters: {{ $exporters }}
    {{- end }}
{{- end }}

{{/* The gateways' scratch space for the symbol store. */}}
{{- define "profsym.gatewaySymbolsDir" -}}/var/lib/profsym/symbols{{- end }}

{{/*
The symbol StatefulSet's collector configuration: the symbolstore
extension over its volume, and a nop pipeline (a collector needs one).
*/}}
{{- define "profsym.symbols.baseConfig" -}}
{{- $st := .Values.symbols.store -}}
extensions:
  {{- include "profsym.extensions" . | nindent 2 }}
  symbolstore:
    endpoint: ${env:PROFSYM_SYMBOLS_LISTEN}
    {{- if include "profsym.symbolsAuth" . }}
    auth:
      authenticator: bearertokenauth/symbols
    {{- end }}
    {{- if include "profsym.tls" . }}
    {{- include "profsym.serverTLS" . | nindent 4 }}
    {{- end }}
    max_upload_size: {{ int64 $st.maxUploadSize }}
    lease_duration: {{ $st.leaseDuration }}
    {{- $cap := $st.maxStoredBytes }}
    {{- if kindIs "invalid" $cap }}
    {{- /* 90% of the volume: the rest for uploads being verified */}}
    {{- $cap = div (mul (include "profsym.bytes" (ternary $st.persistence.size $st.sizeLimit $st.persistence.enabled) | int64) 9) 10 }}
    {{- end }}
    max_stored_bytes: {{ int64 $cap }}
    max_objects: {{ int64 $st.maxObjects }}
    storage:
      directory: {{ $st.mountPath }}
receivers:
  nop: {}
exporters:
  nop: {}
service:
  {{- include "profsym.telemetry" . | nindent 2 }}
    - symbolstore
  pipelines:
    logs:
      receivers: [nop]
      exporters: [nop]
{{- end }}

{{/* The OTLP receiver's auth and TLS, the same on gRPC and HTTP. */}}
{{- define "profsym.gateway.intakeSecurity" -}}
{{- if include "profsym.gatewayAuth" . }}
auth:
  authenticator: bearertokenauth/intake
{{- end }}
{{- if include "profsym.tls" . }}
{{ include "profsym.serverTLS" . }}
{{- end }}
{{- end }}
