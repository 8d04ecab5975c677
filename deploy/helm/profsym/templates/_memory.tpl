{{/*
The gateway's memory, derived from its container memory limit
(docs/deployment.md#gateway-memory): GOMEMLIMIT, and the symbolization
processor's cache budgets that values leave null. The caches together must
fit below the memory limiter's soft limit, or once they fill (as they do by
design) the limiter would refuse every batch.
*/}}

{{/*
profsym.bytes: a Kubernetes quantity ("1536Mi", "2Gi", "1.5G", 1610612736)
as a number of bytes.
*/}}
{{- define "profsym.bytes" -}}
{{- if or (kindIs "float64" .) (kindIs "int" .) (kindIs "int64" .) -}}
{{- int64 . -}}
{{- else -}}
{{- $q := toString . -}}
{{- $num := regexFind "^[0-9]+(\\.[0-9]+)?" $q -}}
{{- $unit := trimPrefix $num $q -}}
{{- $mult := dict "" 1.0 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 -}}
{{- if or (not $num) (not (hasKey $mult $unit)) -}}
{{- fail (printf "memory quantity %q: want a number with one of the suffixes k, M, G, T, Ki, Mi, Gi, Ti" $q) -}}
{{- end -}}
{{- mulf (float64 $num) (get $mult $unit) | floor | int64 -}}
{{- end -}}
{{- end }}

{{/*
profsym.gateway.memory: the derived figures as JSON, all in bytes:
limit (0 without a memory limit), goMemLimit, and the processor's cache
and limit keys (0: not derived, the processor's default applies), budget
(what the caches may hold together, as the processor counts it).
*/}}
{{- define "profsym.gateway.memory" -}}
{{- $g := .Values.gateway -}}
{{- $c := $g.symbolization.cache -}}
{{- $l := $g.symbolization.limits -}}
{{- $limit := 0 -}}
{{- with $g.resources }}{{ with .limits }}{{ with .memory }}{{ $limit = include "profsym.bytes" . | int64 }}{{ end }}{{ end }}{{ end -}}
{{- $share := div (mul $limit (int $c.memoryPercentage)) 100 -}}
{{- $pick := dict -}}
{{- range $k, $part := dict "maxBytes" 2 "maxResultBytes" 5 "maxDemangledBytes" 32 -}}
{{- $v := get $c $k -}}
{{- if not (kindIs "invalid" $v) }}{{ $_ := set $pick $k ($v | int64) }}
{{- else if $limit }}{{ $_ := set $pick $k (div $share $part) }}
{{- else }}{{ $_ := set $pick $k 0 }}{{ end -}}
{{- end -}}
{{- $objects := 0 -}}
{{- if not (kindIs "invalid" $c.maxObjects) }}{{ $objects = $c.maxObjects | int64 }}
{{- else if $limit }}{{ $objects = div $share (mul 16 1300) }}{{ end -}}
{{- $decomp := 0 -}}
{{- if not (kindIs "invalid" $l.maxDecompressedBytes) }}{{ $decomp = $l.maxDecompressedBytes | int64 }}
{{- else if $limit }}{{ $decomp = get $pick "maxBytes" }}{{ end -}}
{{- /* The processor's defaults, for the budget of keys left to it. */ -}}
{{- $mb := get $pick "maxBytes" | default 536870912 -}}
{{- $rb := get $pick "maxResultBytes" | default 268435456 -}}
{{- $db := get $pick "maxDemangledBytes" | default 33554432 -}}
{{- $ob := $objects | default 65536 -}}
{{- $budget := add $mb $rb (max (div $rb 4) 4194304) $db (mul $ob 1264) -}}
{{- $gml := 0 -}}
{{- if and $limit (not (kindIs "invalid" $g.goMemLimitPercentage)) }}{{ $gml = div (mul $limit (int $g.goMemLimitPercentage)) 100 }}{{ end -}}
{{- dict "limit" $limit "goMemLimit" $gml "maxBytes" (get $pick "maxBytes") "maxResultBytes" (get $pick "maxResultBytes") "maxDemangledBytes" (get $pick "maxDemangledBytes") "maxObjects" $objects "maxDecompressedBytes" $decomp "budget" $budget | toJson -}}
{{- end }}

{{/*
profsym.gateway.checkMemory fails when the caches cannot fit.
*/}}
{{- define "profsym.gateway.checkMemory" -}}
{{- $m := include "profsym.gateway.memory" . | fromJson -}}
{{- $ml := .Values.gateway.memoryLimiter -}}
{{- $limit := $m.limit | int64 -}}
{{- if $limit -}}
{{- $soft := div (mul $limit (sub (int $ml.limitPercentage) (int $ml.spikeLimitPercentage))) 100 -}}
{{- if gt ($m.budget | int64) $soft -}}
{{- fail (printf "gateway.symbolization.cache: the caches may hold %d MiB, more than the memory limiter's soft limit of %d MiB (%d%% - %d%% of resources.limits.memory); once they fill, every batch would be refused. Lower the cache values or cache.memoryPercentage, or raise the memory limit" (div ($m.budget | int64) 1048576) (div $soft 1048576) (int $ml.limitPercentage) (int $ml.spikeLimitPercentage)) -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/*
profsym.agent.memoryAvailable: what the agent's container memory limit
leaves beside the BPF maps (agent.bpfMemory), in bytes (0: no limit). The
kernel charges those maps to the container's cgroup (Linux >= 5.11), but
neither the Go runtime nor the memory limiter counts them.
*/}}
{{- define "profsym.agent.memoryAvailable" -}}
{{- $a := .Values.agent -}}
{{- $limit := 0 -}}
{{- with $a.resources }}{{ with .limits }}{{ with .memory }}{{ $limit = include "profsym.bytes" . | int64 }}{{ end }}{{ end }}{{ end -}}
{{- $bpf := 0 -}}
{{- with $a.bpfMemory }}{{ $bpf = include "profsym.bytes" . | int64 }}{{ end -}}
{{- if and $limit (le (int64 $limit) (int64 $bpf)) -}}
{{- fail (printf "agent.resources.limits.memory (%d MiB) must be above agent.bpfMemory (%d MiB): the BPF maps alone would fill it" (div $limit 1048576) (div $bpf 1048576)) -}}
{{- end -}}
{{- if $limit }}{{ sub $limit $bpf }}{{ else }}0{{ end -}}
{{- end }}

{{/*
profsym.agent.goMemLimit: the agent's GOMEMLIMIT in bytes (0: not set),
goMemLimitPercentage of profsym.agent.memoryAvailable.
*/}}
{{- define "profsym.agent.goMemLimit" -}}
{{- $a := .Values.agent -}}
{{- $avail := include "profsym.agent.memoryAvailable" . | int64 -}}
{{- $gml := 0 -}}
{{- if and $avail (not (kindIs "invalid" $a.goMemLimitPercentage)) }}{{ $gml = div (mul $avail (int $a.goMemLimitPercentage)) 100 }}{{ end -}}
{{- $gml -}}
{{- end }}
