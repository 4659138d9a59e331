// Command etcd is the upstream etcd server, built from the Go module proxy for the tests'
// kube-apiserver (see internal/kubetest). Debian's etcd-server is older than Kubernetes needs.
// It lives in its own module so that etcd never enters the product's go.mod.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
