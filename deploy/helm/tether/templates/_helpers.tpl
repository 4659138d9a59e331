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
{{- $cfg := omit (deepCopy .Values.config) "listeners" "tls" "auth" "store" "shutdown" "apiVersion" -}}
{{- $listeners := dict
  "extProc" (printf "0.0.0.0:%d" (int .Values.ports.extProc))
  "xds" (printf "0.0.0.0:%d" (int .Values.ports.xds))
  "api" (printf "0.0.0.0:%d" (int .Values.ports.api))
  "sip" (ternary (printf "0.0.0.0:%d" (int .Values.ports.sip)) "" .Values.sip.enabled) -}}
{{- if not .Values.tls.existingSecret -}}
{{- $_ := set $listeners "allowInsecure" true -}}
{{- end -}}
{{- $tokens := list -}}
{{- range .Values.auth.tokens -}}
{{- $tokens = append $tokens (dict "name" .name "tokenFile" (printf "../tokens/%s" .name) "access" (default "read" .access) "services" (default (list "*") .services)) -}}
{{- end -}}
{{- $store := dict -}}
{{- if eq .Values.store.backend "redis" -}}
{{- $r := .Values.store.redis -}}
{{- $redis := dict "addresses" $r.addresses "db" (int $r.db) "keyPrefix" $r.keyPrefix -}}
{{- with $r.masterSet }}{{ $_ := set $redis "masterSet" . }}{{ end -}}
{{- with $r.username }}{{ $_ := set $redis "username" . }}{{ end -}}
{{- if $r.existingSecret -}}
{{- $_ := set $redis "passwordFile" "../redis/password" -}}
{{- end -}}
{{- if $r.tls.enabled -}}
{{- $rtls := dict "enabled" true -}}
{{- with $r.tls.serverName }}{{ $_ := set $rtls "serverName" . }}{{ end -}}
{{- if $r.tls.caSecret }}{{ $_ := set $rtls "caFile" "../redis-ca/ca.crt" }}{{ end -}}
{{- $_ := set $redis "tls" $rtls -}}
{{- end -}}
{{- $store = dict "backend" "redis" "redis" $redis -}}
{{- else if .Values.store.snapshot.enabled -}}
{{- $store = dict "snapshotPath" "/var/lib/tether/sessions.snap" "snapshotInterval" .Values.store.snapshot.interval -}}
{{- end -}}
{{- $shutdown := dict "drainTimeout" (printf "%ds" (int .Values.shutdown.drainTimeoutSeconds)) "handoff" .Values.shutdown.handoff -}}
{{- $out := dict "apiVersion" "tether/v1" "listeners" $listeners "auth" (dict "tokens" $tokens) "shutdown" $shutdown -}}
{{- if $store -}}
{{- $_ := set $out "store" $store -}}
{{- end -}}
{{- if .Values.tls.existingSecret -}}
{{- $tls := dict "certFile" "../tls/tls.crt" "keyFile" "../tls/tls.key" -}}
{{- if .Values.tls.mutual -}}
{{- $_ := set $tls "clientCAFile" "../tls/ca.crt" -}}
{{- end -}}
{{- $_ := set $out "tls" $tls -}}
{{- end -}}
{{- $g := .Values.discovery.gatewayAPI -}}
{{- if $g.enabled -}}
{{- $gw := dict "enabled" true -}}
{{- with $g.namespace }}{{ $_ := set $gw "namespace" . }}{{ end -}}
{{- with $g.gatewayClasses }}{{ $_ := set $gw "gatewayClasses" . }}{{ end -}}
{{- with $g.routeSelector }}{{ $_ := set $gw "routeSelector" . }}{{ end -}}
{{- with $g.controllerName }}{{ $_ := set $gw "controllerName" . }}{{ end -}}
{{- $disc := dict -}}
{{- with $cfg.discovery }}{{ $disc = . }}{{ end -}}
{{- $_ := set $disc "gatewayAPI" $gw -}}
{{- $_ := set $cfg "discovery" $disc -}}
{{- end -}}
{{- toYaml (merge $out $cfg) -}}
{{- end -}}

{{/* The probes: gRPC health and HTTP(S) checks; TCP checks under mutual TLS (no kubelet certificate). */}}
{{- define "tether.probes" -}}
{{- $scheme := ternary "HTTPS" "HTTP" (not (empty .Values.tls.existingSecret)) -}}
{{- if .Values.tls.mutual }}
startupProbe:
  tcpSocket:
    port: extproc
{{- else if .Values.tls.existingSecret }}
startupProbe:
  httpGet:
    path: /healthz
    port: api
    scheme: HTTPS
{{- else }}
# gRPC health of the ext_proc server until it first answers, then the HTTP checks.
startupProbe:
  grpc:
    port: {{ .Values.ports.extProc }}
{{- end }}
  periodSeconds: {{ .Values.probes.startup.periodSeconds }}
  failureThreshold: {{ .Values.probes.startup.failureThreshold }}
livenessProbe:
{{- if .Values.tls.mutual }}
  tcpSocket:
    port: api
{{- else }}
  httpGet:
    path: /healthz
    port: api
    scheme: {{ $scheme }}
{{- end }}
  periodSeconds: {{ .Values.probes.liveness.periodSeconds }}
  failureThreshold: {{ .Values.probes.liveness.failureThreshold }}
readinessProbe:
{{- if .Values.tls.mutual }}
  tcpSocket:
    port: api
{{- else }}
  httpGet:
    path: /readyz
    port: api
    scheme: {{ $scheme }}
{{- end }}
  periodSeconds: {{ .Values.probes.readiness.periodSeconds }}
  failureThreshold: {{ .Values.probes.readiness.failureThreshold }}
{{- end -}}

{{/* The service account token is mounted only for a discovery source that reads the API. */}}
{{- define "tether.kubeAPI" -}}
{{- or .Values.discovery.kubernetes.enabled .Values.discovery.gatewayAPI.enabled -}}
{{- end -}}

{{/* The image: repository@digest when image.digest pins it, else repository:tag. */}}
{{- define "tether.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/*
GOMEMLIMIT for goMemLimit "auto": 90% of resources.limits.memory in whole MiB ("" without a
memory limit). Quantities: plain bytes, or an integer with a suffix Ki Mi Gi Ti k M G T.
*/}}
{{- define "tether.goMemLimitAuto" -}}
{{- $limit := "" -}}
{{- with .Values.resources -}}{{- with .limits -}}{{- with .memory -}}{{- $limit = toString . -}}{{- end -}}{{- end -}}{{- end -}}
{{- if $limit -}}
{{- $units := dict "" 1 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 -}}
{{- $num := regexFind "^[0-9]+" $limit -}}
{{- $suffix := trimPrefix $num $limit -}}
{{- if or (not $num) (not (hasKey $units $suffix)) -}}
{{- fail (printf "resources.limits.memory %q: goMemLimit auto reads whole quantities with Ki, Mi, Gi, Ti, k, M, G or T; set goMemLimit (e.g. 400MiB) or \"\"" $limit) -}}
{{- end -}}
{{- div (mul (int64 $num) (get $units $suffix) 9) (mul 10 1048576) -}}MiB
{{- end -}}
{{- end -}}

{{/* The container's env: GOMEMLIMIT (goMemLimit), then env (sorted by name), then extraEnv. */}}
{{- define "tether.env" -}}
{{- $names := dict -}}
{{- range $k, $_ := .Values.env -}}{{- $_ := set $names $k true -}}{{- end -}}
{{- range .Values.extraEnv -}}{{- $_ := set $names .name true -}}{{- end -}}
{{- $mem := .Values.goMemLimit -}}
{{- if eq $mem "auto" -}}{{- $mem = include "tether.goMemLimitAuto" . -}}{{- end -}}
{{- if hasKey $names "GOMEMLIMIT" -}}{{- $mem = "" -}}{{- end -}}
{{- if or $mem .Values.env .Values.extraEnv -}}
env:
{{- if $mem }}
  - name: GOMEMLIMIT
    value: {{ $mem | quote }}
{{- end }}
{{- range $k, $v := .Values.env }}
  - name: {{ $k }}
    value: {{ $v | quote }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . | indent 2 }}
{{- end }}
{{- end -}}
{{- end -}}

{{/* terminationGracePeriodSeconds: as set, else what a drain may take (values.yaml shutdown). */}}
{{- define "tether.terminationGracePeriodSeconds" -}}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds -}}
{{- $s := .Values.shutdown -}}
{{- add (int $s.preStopSleepSeconds) (int $s.healthCheckMoveAwaySeconds) (int $s.drainTimeoutSeconds) 20 -}}
{{- else -}}
{{- int .Values.terminationGracePeriodSeconds -}}
{{- end -}}
{{- end -}}
