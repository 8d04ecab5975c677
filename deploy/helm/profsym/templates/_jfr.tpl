{{/*
The jfr receiver on the gateway (gateway.jfr, docs/jfr.md): JFR recordings
from Java profilers over the Datadog profiling intake and Pyroscope's
ingest, into the gateway's profiles pipeline.
*/}}
{{- define "profsym.jfrAuth" -}}
{{- $j := .Values.gateway.jfr -}}
{{- if and $j.enabled (or $j.auth.existingSecret $j.auth.value) }}true{{ end }}
{{- end }}

{{- define "profsym.jfrTokenSecret" -}}
{{- default (printf "%s-jfr-token" (include "profsym.fullname" .)) .Values.gateway.jfr.auth.existingSecret }}
{{- end }}

{{/* Where the jfr token Secret is mounted in the gateway. */}}
{{- define "profsym.jfrTokenDir" -}}/etc/profsym-jfr{{- end }}

{{- define "profsym.gateway.jfrExtension" -}}
{{- $a := .Values.gateway.jfr.auth -}}
bearertokenauth/jfr:
  filename: {{ include "profsym.jfrTokenDir" . }}/token
  header: {{ $a.header | quote }}
  scheme: {{ $a.scheme | quote }}
{{- end }}

{{- define "profsym.gateway.jfrReceiver" -}}
{{- $j := .Values.gateway.jfr -}}
jfr:
  endpoint: ${env:PROFSYM_JFR_LISTEN}
  {{- if include "profsym.tls" . }}
  {{- include "profsym.serverTLS" . | nindent 2 }}
  {{- end }}
  max_request_body_size: {{ int64 $j.maxRequestBodySize }}
  max_recording_size: {{ int64 $j.maxRecordingSize }}
  max_chunk_size: {{ int64 $j.maxChunkSize }}
  read_timeout: {{ $j.readTimeout }}
  {{- if include "profsym.jfrAuth" . }}
  auth:
    authenticator: bearertokenauth/jfr
  {{- else if include "profsym.gatewayAuth" . }}
  # No token of its own: the intake token, as Authorization: Bearer.
  auth:
    authenticator: bearertokenauth/intake
  {{- end }}
  datadog:
    enabled: {{ $j.datadog.enabled }}
    path: {{ $j.datadog.path | quote }}
  pyroscope:
    enabled: {{ $j.pyroscope.enabled }}
    path: {{ $j.pyroscope.path | quote }}
{{- end }}
