{{/*
Tokens and TLS (docs/deployment.md#security).
*/}}

{{/*
profsym.tokenData: the base64 of a token Secret's key: the given value,
else what the Secret already holds (helm upgrade keeps it: lookup), else a
new random token. Renderers without cluster access (helm template, Argo CD)
see no Secret and make a new token on every render. Call with
(dict "ctx" $ "name" secretName "key" key "value" value).
*/}}
{{- define "profsym.tokenData" -}}
{{- if .value -}}
{{- .value | b64enc -}}
{{- else -}}
{{- $old := lookup "v1" "Secret" .ctx.Release.Namespace .name -}}
{{- if and $old $old.data (hasKey $old.data .key) (index $old.data .key) -}}
{{- index $old.data .key -}}
{{- else -}}
{{- randAlphaNum 48 | b64enc -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* The gateway's intake token (gateway.auth): on, and its Secret. */}}
{{- define "profsym.gatewayAuth" -}}
{{- if and .Values.gateway.enabled .Values.gateway.auth.enabled }}true{{ end }}
{{- end }}

{{- define "profsym.gatewayTokenSecret" -}}
{{- default (printf "%s-gateway-token" (include "profsym.fullname" .)) .Values.gateway.auth.existingSecret }}
{{- end }}

{{/* Where the gateway token Secret is mounted in the gateway. */}}
{{- define "profsym.gatewayTokenDir" -}}/etc/profsym-gateway-token{{- end }}

{{/*
profsym.tls: "true" when TLS is on; fails on a setting that cannot work.
profsym.tlsSecret: the Secret holding tls.crt, tls.key and ca.crt.
profsym.certManager: "true" when the chart renders cert-manager objects.
*/}}
{{- define "profsym.tls" -}}
{{- if .Values.tls.enabled }}true{{ end }}
{{- end }}

{{- define "profsym.certManager" -}}
{{- $t := .Values.tls -}}
{{- if and $t.enabled (not $t.existingSecret) -}}
{{- if or $t.certManager.enabled (.Capabilities.APIVersions.Has "cert-manager.io/v1") -}}
true
{{- else -}}
{{- fail "tls.enabled: set tls.existingSecret (a kubernetes.io/tls Secret with tls.crt, tls.key and ca.crt), or install cert-manager (cert-manager.io/v1; helm template needs --api-versions cert-manager.io/v1 or tls.certManager.enabled=true)" -}}
{{- end -}}
{{- end -}}
{{- end }}

{{- define "profsym.tlsSecret" -}}
{{- default (printf "%s-tls" (include "profsym.fullname" .)) .Values.tls.existingSecret }}
{{- end }}

{{/* Where the TLS Secret is mounted in every workload. */}}
{{- define "profsym.tlsDir" -}}/etc/profsym-tls{{- end }}

{{/* The DNS names the certificate must hold: every Service name the agents and gateways dial, short and qualified. */}}
{{- define "profsym.tlsDNSNames" -}}
{{- $ns := .Release.Namespace -}}
{{- $names := list -}}
{{- range list (include "profsym.gatewayName" .) (include "profsym.gatewayHeadlessName" .) (include "profsym.symbolsName" .) -}}
{{- $names = concat $names (list . (printf "%s.%s" . $ns) (printf "%s.%s.svc" . $ns) (printf "%s.%s.svc.%s" . $ns $.Values.clusterDomain)) -}}
{{- end -}}
{{- toJson $names -}}
{{- end }}

{{/* A server's tls block (confighttp, configgrpc). */}}
{{- define "profsym.serverTLS" -}}
tls:
  cert_file: {{ include "profsym.tlsDir" . }}/tls.crt
  key_file: {{ include "profsym.tlsDir" . }}/tls.key
{{- end }}

{{/* A client's tls block, verifying servers against the chart's CA. */}}
{{- define "profsym.clientTLS" -}}
tls:
  ca_file: {{ include "profsym.tlsDir" . }}/ca.crt
{{- end }}

{{/* The TLS volume and its mount. */}}
{{- define "profsym.tlsVolume" -}}
- name: tls
  secret:
    secretName: {{ include "profsym.tlsSecret" . }}
{{- end }}

{{- define "profsym.tlsVolumeMount" -}}
- name: tls
  mountPath: {{ include "profsym.tlsDir" . }}
  readOnly: true
{{- end }}

{{/* The agent's priority class: agent.priorityClassName, else the chart's own (priorityClass.create). */}}
{{- define "profsym.agentPriorityClass" -}}
{{- if .Values.agent.priorityClassName }}{{ .Values.agent.priorityClassName }}
{{- else if .Values.priorityClass.create }}{{ include "profsym.agentName" . }}{{ end }}
{{- end }}
