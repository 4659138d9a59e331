#!/usr/bin/env bash
# Builds kube-apiserver and etcd for internal/kubetest from the Go module proxy, once per
# version, into the cache directory that kubetest reads (kubetest.BinDir):
#   ${TETHER_KUBE_CACHE:-$HOME/.cache/tether/kube}/<kubernetes version>/kube-apiserver
#   ${TETHER_KUBE_CACHE:-$HOME/.cache/tether/kube}/etcd-<etcd version>/etcd
# Prints the two paths. Idempotent: an existing binary is kept.
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
cache=${TETHER_KUBE_CACHE:-$HOME/.cache/tether/kube}

build() { # dir out [ldflags]
  local dir=$1 out=$2 ldflags="-s ${3:-}"
  if [ -x "$out" ]; then return; fi
  echo "deps: building $(basename "$out") from $dir (once; cached at $out)"
  mkdir -p "$(dirname "$out")"
  (cd "$dir" && CGO_ENABLED=0 go build -trimpath -ldflags="$ldflags" -o "$out.tmp" .)
  mv "$out.tmp" "$out"
}
build internal/kubetest/etcd "$cache/etcd-$etcd_version/etcd"
# The version the server reports (/version, kubectl version) is the module's.
build internal/kubetest/apiserver "$cache/$kube_version/kube-apiserver" \
  "-X k8s.io/component-base/version.gitVersion=$kube_version -X k8s.io/component-base/version.gitMajor=$(echo "$kube_version" | cut -d. -f1 | tr -d v) -X k8s.io/component-base/version.gitMinor=$(echo "$kube_version" | cut -d. -f2)"
