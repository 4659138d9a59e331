#!/usr/bin/env bash
# Installs what tether's tests need on a fresh Debian machine, printing each step, what it
# installs and how long it took. Needs root (or sudo) for apt-get. Idempotent: skips what is
# already installed, and caches the kube-apiserver and etcd builds by version (.ci/kubebins.sh).
#   1. Debian packages: kamailio (+ its HTTP client module), sipp, curl, redis-server,
#      redis-sentinel, redis-tools, prometheus (promtool and the server the scrape test runs),
#      chromium (the dashboard's browser tests, driven by playwright-core), kubectl,
#      dnsmasq-base, iproute2
#   2. npm ci in every directory with a package-lock.json (MCP SDKs, the dashboard's Vite build)
#   3. kube-apiserver and etcd for internal/kubetest, built from the Go module proxy (the first
#      run on a machine: 5-20 min on 2 cores, with a progress line every 30 s; then cached)
#   4. Go modules (tether's, deploy/test's, the ServiceMonitor CRD's)
set -euo pipefail
cd "$(dirname "$0")/.."

sudo_cmd=()
if [ "$(id -u)" != 0 ]; then sudo_cmd=(sudo); fi

started=$SECONDS
# CPU seconds (user+sys) this script and its finished children have used: on a loaded machine
# the wall time says little, the CPU time is what a step costs.
tck=$(getconf CLK_TCK)
cpu() { awk -v t="$tck" '{printf "%d", ($14 + $15 + $16 + $17) / t}' /proc/$$/stat; }
times=()
step_name="" step_start=0 step_cpu=0
step() { # n name
  end_step
  step_name="$2" step_start=$SECONDS step_cpu=$(cpu)
  echo "deps [$1/4] $2"
}
end_step() {
  if [ -n "$step_name" ]; then times+=("$(printf '%4ds wall %5ds CPU  %s' $((SECONDS - step_start)) $(($(cpu) - step_cpu)) "$step_name")"); fi
}

step 1 "Debian packages"
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
# promtool checks the alert rules (deploy/prometheus); /usr/bin/prometheus scrapes a test tether
# (pkg/metrics); chromium runs the dashboard's browser tests (playwright-core: no download).
command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# discovery: kubectl drives `kubectl apply --dry-run=server` against internal/kubetest's API
# server; dnsmasq is the DNS source's test server; iproute2 makes the network namespaces that
# host EndpointSlice test addresses.
command -v kubectl >/dev/null 2>&1 || need+=(kubectl)
command -v dnsmasq >/dev/null 2>&1 || need+=(dnsmasq-base)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
if [ ${#need[@]} -gt 0 ]; then
  echo "deps: apt-get install ${need[*]} (${#need[@]} packages and their dependencies, ~160 MB on a fresh Debian 12)"
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
else
  echo "deps: every Debian package is installed already"
fi

# Node packages for tests that drive the official TypeScript MCP SDK and for the dashboard's
# build. node_modules/.tether-lock is the package-lock.json the last npm ci installed, so a
# changed lock file installs again.
step 2 "npm packages"
for dir in $(git ls-files '*package-lock.json' | xargs -r -n1 dirname); do
  if ! cmp -s "$dir/package-lock.json" "$dir/node_modules/.tether-lock"; then
    echo "deps: npm ci in $dir"
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error && cp package-lock.json node_modules/.tether-lock)
  else
    echo "deps: $dir/node_modules is up to date"
  fi
done

step 3 "kube-apiserver and etcd (internal/kubetest)"
.ci/kubebins.sh

step 4 "Go modules"
echo "deps: go mod download (tether, deploy/test, prometheus-operator's ServiceMonitor CRD)"
go mod download
# deploy: `kubectl apply --dry-run=server` of the chart and kustomize manifests (deploy/k8stest)
# installs prometheus-operator's ServiceMonitor CRD from its module; deploy/test is a module of
# its own.
go mod download github.com/prometheus-operator/prometheus-operator@v0.85.0
(cd deploy/test && go mod download)
end_step

echo "deps: done in $((SECONDS - started))s ($(cpu)s CPU; load $(cut -d" " -f1-3 /proc/loadavg))"
printf '  %s\n' "${times[@]}"
