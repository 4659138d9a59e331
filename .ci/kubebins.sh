#!/usr/bin/env bash
# Builds kube-apiserver and etcd for internal/kubetest from the Go module proxy, once per
# version, into the cache directory that kubetest reads (kubetest.BinDir):
#   ${TETHER_KUBE_CACHE:-$HOME/.cache/tether/kube}/<kubernetes version>/kube-apiserver
#   ${TETHER_KUBE_CACHE:-$HOME/.cache/tether/kube}/etcd-<etcd version>/etcd
# Prints the two paths. Idempotent: an existing binary is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
kube_version=$(awk '$1=="require" && $2=="k8s.io/kubernetes" {print $3}' internal/kubetest/apiserver/go.mod)
etcd_version=$(awk '$1=="require" && $2=="go.etcd.io/etcd/server/v3" {print $3}' internal/kubetest/etcd/go.mod)
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
