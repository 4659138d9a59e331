#!/usr/bin/env bash
# Installs what tether's tests need on a fresh Debian machine, printing each step, what it
# installs and how long it took. Needs root (or sudo) for apt-get. Idempotent: skips what is
# already installed, and caches the kube-apiserver and etcd builds by version (.ci/kubebins.sh).
# The four steps run at once (the build is CPU, the rest mostly network and disk), each line
# prefixed with its step; at the end each step's wall and CPU time:
#   1. Debian packages: kamailio (+ its HTTP client module), sipp, curl, redis-server,
#      redis-sentinel, redis-tools, prometheus (promtool and the server the scrape test runs),
#      chromium (the dashboard's browser tests, driven by playwright-core), kubectl,
#      dnsmasq-base, iproute2 (on a fresh Debian 12 machine of this project's kind: 60 packages,
#      160 MB, about 1.5 min with apt-get update)
#   2. npm ci in every directory with a package-lock.json (MCP SDKs, the dashboard's Vite build)
#   3. kube-apiserver and etcd for internal/kubetest, built from the Go module proxy (the first
#      run on a machine: about 14 CPU-minutes, 7-8 min on 2 idle cores, with a progress line
#      every 30 s; then cached)
#   4. Go modules (tether's, deploy/test's, the ServiceMonitor CRD's)
set -euo pipefail
cd "$(dirname "$0")/.."

sudo_cmd=()
if [ "$(id -u)" != 0 ]; then sudo_cmd=(sudo); fi

started=$SECONDS
tck=$(getconf CLK_TCK)
results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT
# run_step n name function: runs function in the background, its output prefixed "deps [n/4]",
# and records its wall time and CPU seconds (user+sys of everything it ran: on a loaded machine
# the wall time says little, the CPU time is what a step costs) and its exit code.
run_step() {
  local n=$1 name=$2 fn=$3
  echo "deps [$n/4] $name: started"
  (
    set -o pipefail
    (
      t0=$SECONDS rc=0
      # In the background, not under ||, so that set -e stops the step at its first failure.
      "$fn" &
      wait "$!" || rc=$?
      awk -v t="$tck" -v w=$((SECONDS - t0)) -v rc="$rc" -v name="$name" \
        '{printf "%4ds wall %5ds CPU  %s%s\n", w, ($14 + $15 + $16 + $17) / t, name, rc ? " (FAILED, exit " rc ")" : ""}' \
        "/proc/$BASHPID/stat" >"$results/$n"
      echo "finished: $(cat "$results/$n")"
      exit "$rc"
    ) 2>&1 | sed -u "/^$/d; s|^deps: ||; s|^|deps [$n/4] |"
  ) &
}

debian_packages() {
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
  # Debian 12 has no kubectl (its kubernetes-client is 1.20); this project's machines come with one.
  if [[ " ${need[*]} " == *" kubectl "* ]] && ! apt-cache show kubectl >/dev/null 2>&1; then
    echo "deps: kubectl is in none of this machine's apt sources (Debian 12 has none): install it from Kubernetes' own apt repository, then run make deps again" >&2
    exit 1
  fi
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
else
  echo "deps: every Debian package is installed already"
fi
}

# Node packages for tests that drive the official TypeScript MCP SDK and for the dashboard's
# build. node_modules/.tether-lock is the package-lock.json the last npm ci installed, so a
# changed lock file installs again.
npm_packages() {
for dir in $(git ls-files '*package-lock.json' | xargs -r -n1 dirname); do
  if ! cmp -s "$dir/package-lock.json" "$dir/node_modules/.tether-lock"; then
    echo "deps: npm ci in $dir"
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error && cp package-lock.json node_modules/.tether-lock)
  else
    echo "deps: $dir/node_modules is up to date"
  fi
done
}

go_modules() {
echo "deps: go mod download (tether, deploy/test, prometheus-operator's ServiceMonitor CRD)"
go mod download
# deploy: `kubectl apply --dry-run=server` of the chart and kustomize manifests (deploy/k8stest)
# installs prometheus-operator's ServiceMonitor CRD from its module; deploy/test is a module of
# its own.
go mod download github.com/prometheus-operator/prometheus-operator@v0.85.0
(cd deploy/test && go mod download)
}

run_step 1 "Debian packages" debian_packages
run_step 2 "npm packages" npm_packages
run_step 3 "kube-apiserver and etcd (internal/kubetest)" .ci/kubebins.sh
run_step 4 "Go modules" go_modules
failed=0
while [ "$(jobs -pr | wc -l)" -gt 0 ]; do wait -n || failed=1; done
wait || failed=1

echo "deps: done in $((SECONDS - started))s (load $(cut -d" " -f1-3 /proc/loadavg))"
for n in 1 2 3 4; do
  if [ -f "$results/$n" ]; then sed 's/^/  /' "$results/$n"; else echo "  step $n: no result"; failed=1; fi
done
if grep -q FAILED "$results"/* || [ "$failed" -ne 0 ]; then
  echo "deps: FAILED (the step's output is above, prefixed with its number)" >&2
  exit 1
fi
