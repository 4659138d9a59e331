#!/usr/bin/env bash
# Installs what tether's tests need on a fresh Debian machine: Kamailio (with its HTTP client
# module) and SIPp from Debian's packages, the TypeScript MCP SDK from npm, and Go modules.
# Idempotent: skips what is already installed.
set -euo pipefail
cd "$(dirname "$0")/.."

sudo_cmd=()
if [ "$(id -u)" != 0 ]; then sudo_cmd=(sudo); fi

need=()
command -v kamailio >/dev/null 2>&1 || need+=(kamailio)
# http_client (Kamailio asks tether over HTTP) ships in kamailio-utils-modules.
ls /usr/lib/*/kamailio/modules/http_client.so >/dev/null 2>&1 || need+=(kamailio-utils-modules)
command -v sipp >/dev/null 2>&1 || need+=(sip-tester)
# make demo's test runs the curl commands the demo prints.
command -v curl >/dev/null 2>&1 || need+=(curl)
# Redis for the shared session store's tests (internal/redistest): server, Sentinel, redis-cli.
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-sentinel >/dev/null 2>&1 || need+=(redis-sentinel)
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
# promtool checks the alert rules (deploy/prometheus); chromium runs the dashboard's browser
# tests (cmd/tether/ui, driven by playwright-core: no browser download).
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  echo "deps: installing ${need[*]} from Debian's packages"
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
fi

# Node packages for tests that drive the official TypeScript MCP SDK. node_modules/.tether-lock
# is the package-lock.json the last npm ci installed, so a changed lock file installs again.
for dir in $(git ls-files '*package-lock.json' | xargs -r -n1 dirname); do
  if ! cmp -s "$dir/package-lock.json" "$dir/node_modules/.tether-lock"; then
    echo "deps: npm ci in $dir"
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error && cp package-lock.json node_modules/.tether-lock)
  fi
done

# discovery: a real kube-apiserver and etcd for internal/kubetest, built from the Go module proxy
# (their own modules under internal/kubetest/, outside tether's go.mod) and cached outside the
# repository keyed by version, so only the first run pays the ~4 minute build. kubectl (Debian)
# drives `kubectl apply --dry-run=server` against it; dnsmasq is the DNS source's test server;
# iproute2 makes the network namespaces that host EndpointSlice test addresses.
need=()
command -v kubectl >/dev/null 2>&1 || need+=(kubectl)
command -v dnsmasq >/dev/null 2>&1 || need+=(dnsmasq-base)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
if [ ${#need[@]} -gt 0 ]; then
  echo "deps: installing ${need[*]} from Debian's packages"
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
fi
.ci/kubebins.sh

go mod download
# deploy: `kubectl apply --dry-run=server` of the chart and kustomize manifests (deploy/k8stest,
# kubectl from the discovery block above) installs prometheus-operator's ServiceMonitor CRD from
# its module; deploy/test is a module of its own.
go mod download github.com/prometheus-operator/prometheus-operator@v0.85.0
(cd deploy/test && go mod download)
