// Command render prints tether's Helm chart or kustomize manifests as rendered by Helm's and
// kustomize's Go libraries, for tests in tether's own module that must not import them:
//
//	go run ./cmd/render helm [-f values.yaml] [-n namespace] CHART_DIR
//	go run ./cmd/render kustomize [-n namespace] DIR
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/tether-dev/tether/deploy/test/render"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "render:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: render helm|kustomize [flags] DIR")
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	values := fs.String("f", "", "Helm values `file`")
	ns := fs.String("n", "", "`namespace`")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("%s: one directory", args[0])
	}
	var out []byte
	var err error
	switch args[0] {
	case "helm":
		var v map[string]any
		if *values != "" {
			if v, err = render.HelmValuesFile(*values); err != nil {
				return err
			}
		}
		if *ns == "" {
			*ns = "default"
		}
		out, err = render.Helm(fs.Arg(0), v, *ns)
	case "kustomize":
		out, err = render.Kustomize(fs.Arg(0), *ns)
	default:
		return fmt.Errorf("unknown renderer %q", args[0])
	}
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(out)
	return err
}
