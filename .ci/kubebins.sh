#!/usr/bin/env bash
# Builds kube-apiserver and etcd for internal/kubetest from the Go module proxy, once per
# version, into the cache directory that kubetest reads (kubetest.BinDir):
#   ${TETHER_KUBE_CACHE:-$HOME/.cache/tether/kube}/<kubernetes version>/kube-apiserver
#   ${TETHER_KUBE_CACHE:-$HOME/.cache/tether/kube}/etcd-<etcd version>/etcd
# The cache is keyed by those versions (the required versions in internal/kubetest/*/go.mod):
# `.ci/kubebins.sh --key` prints the key (CI caches ~/.cache/tether under it). Idempotent: an
# existing binary is kept. A build prints a progress line every 30 s (packages compiled so far).
set -euo pipefail
cd "$(dirname "$0")/.."
# The required version of module $2 in go.mod $1 (single-line or block form).
required() { awk -v m="$2" '$1=="require" && $2==m {print $3; exit} $1==m && $2 ~ /^v/ {print $2; exit}' "$1"; }
kube_version=$(required internal/kubetest/apiserver/go.mod k8s.io/kubernetes)
etcd_version=$(required internal/kubetest/etcd/go.mod go.etcd.io/etcd/server/v3)
if [ -z "$kube_version" ] || [ -z "$etcd_version" ]; then
  echo "kubebins: cannot read the versions from internal/kubetest/*/go.mod" >&2
  exit 1
fi
if [ "${1:-}" = "--key" ]; then
  echo "kube-$kube_version-etcd-$etcd_version"
  exit 0
fi
cache=${TETHER_KUBE_CACHE:-$HOME/.cache/tether/kube}

build() { # dir out [ldflags]
  local dir=$1 out=$2 ldflags="-s -w ${3:-}" name log pid start rc
  name=$(basename "$out")
  if [ -x "$out" ]; then
    echo "deps: $name cached at $out"
    return
  fi
  log=$(mktemp)
  start=$SECONDS
  echo "deps: building $name from $dir (once per version; cached at $out)"
  echo "deps: $name: downloading its modules"
  (cd "$dir" && go mod download)
  total=$(cd "$dir" && go list -deps . | wc -l)
  echo "deps: $name: compiling up to $total packages ($(( (SECONDS - start) / 60 ))m so far)"
  mkdir -p "$(dirname "$out")"
  (cd "$dir" && CGO_ENABLED=0 go build -v -trimpath -ldflags="$ldflags" -o "$out.tmp" . 2>"$log") &
  pid=$!
  while ! wait_for "$pid" 30; do
    echo "deps: $name: $(grep -cv '^#' "$log") of up to $total packages compiled (cached ones not counted), $(( (SECONDS - start) / 60 ))m$(( (SECONDS - start) % 60 ))s"
  done
  rc=0
  wait "$pid" || rc=$?
  if [ "$rc" -ne 0 ]; then
    cat "$log" >&2
    rm -f "$log"
    echo "kubebins: building $name failed" >&2
    exit "$rc"
  fi
  rm -f "$log"
  mv "$out.tmp" "$out"
  echo "deps: $name built in $(( (SECONDS - start) / 60 ))m$(( (SECONDS - start) % 60 ))s"
}
# wait_for pid seconds: true once the process has exited, false if it still runs after seconds.
wait_for() {
  local i
  for ((i = 0; i < $2; i++)); do
    kill -0 "$1" 2>/dev/null || return 0
    sleep 1
  done
  ! kill -0 "$1" 2>/dev/null
}
build internal/kubetest/etcd "$cache/etcd-$etcd_version/etcd"
# The version the server reports (/version, kubectl version) is the module's.
build internal/kubetest/apiserver "$cache/$kube_version/kube-apiserver" \
  "-X k8s.io/component-base/version.gitVersion=$kube_version -X k8s.io/component-base/version.gitMajor=$(echo "$kube_version" | cut -d. -f1 | tr -d v) -X k8s.io/component-base/version.gitMinor=$(echo "$kube_version" | cut -d. -f2)"
