{{/* The release's name, truncated to Kubernetes' 63 characters. */}}
{{- define "tether.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tether.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "tether.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tether.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tether.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "tether.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: control-plane
{{- end -}}

{{- define "tether.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tether.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "tether.tokenSecret" -}}
{{- default (printf "%s-tokens" (include "tether.fullname" .)) .Values.auth.existingSecret -}}
{{- end -}}

{{/*
tether.yaml: .Values.config with the listeners, auth and store the chart owns. Paths are
relative to the config file's directory (/etc/tether/config), so the token and Redis password
files resolve wherever the three volumes are mounted side by side.
*/}}
{{- define "tether.config" -}}
{{- $cfg := omit (deepCopy .Values.config) "listeners" "auth" "store" "apiVersion" -}}
{{- $listeners := dict
  "extProc" (printf "0.0.0.0:%d" (int .Values.ports.extProc))
  "xds" (printf "0.0.0.0:%d" (int .Values.ports.xds))
  "api" (printf "0.0.0.0:%d" (int .Values.ports.api))
  "sip" (ternary (printf "0.0.0.0:%d" (int .Values.ports.sip)) "" .Values.sip.enabled) -}}
{{- $tokens := list -}}
{{- range .Values.auth.tokens -}}
{{- $tokens = append $tokens (dict "name" .name "tokenFile" (printf "../tokens/%s" .name) "access" (default "read" .access) "services" (default (list "*") .services)) -}}
{{- end -}}
{{- $store := dict -}}
{{- if eq .Values.store.backend "redis" -}}
{{- $redis := dict "address" .Values.store.redis.address "database" (int .Values.store.redis.database) "keyPrefix" .Values.store.redis.keyPrefix "tls" .Values.store.redis.tls -}}
{{- if .Values.store.redis.existingSecret -}}
{{- $_ := set $redis "passwordFile" "../redis/password" -}}
{{- end -}}
{{- $store = dict "backend" "redis" "redis" $redis -}}
{{- else if .Values.store.snapshot.enabled -}}
{{- $store = dict "snapshotPath" "/var/lib/tether/sessions.snap" "snapshotInterval" .Values.store.snapshot.interval -}}
{{- end -}}
{{- $out := dict "apiVersion" "tether/v1" "listeners" $listeners "auth" (dict "tokens" $tokens) -}}
{{- if $store -}}
{{- $_ := set $out "store" $store -}}
{{- end -}}
{{- toYaml (merge $out $cfg) -}}
{{- end -}}
