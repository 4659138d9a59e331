// Command kube-apiserver is the upstream Kubernetes API server, built from the Go module proxy
// so that tests can run against a real one (see internal/kubetest). It lives in its own module
// so that k8s.io/kubernetes never enters the product's go.mod.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
