// Package deploytest checks what tether ships for running it: the Dockerfile, the Helm chart
// and kustomize manifests under deploy/, the compose example and the GitHub workflows. It is a
// module of its own so that Helm, kustomize, compose-go, buildkit and actionlint stay out of
// tether's module; `make test` runs it. Nothing here runs Docker, a cluster or GitHub Actions:
// each file parses, renders and validates with the owning project's own Go libraries and says
// what it could not run.
package deploytest
