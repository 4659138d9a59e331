// Package recipetest decodes the attachment recipes under deploy/ (envoy-gateway, istio)
// strictly into their projects' own Go API types — Envoy Gateway's api/v1alpha1, the Gateway
// API, the Gateway API Inference Extension, Istio's networking types, Kubernetes core — and the
// Envoy configuration inside them into go-control-plane's types, and checks that they say what
// tether needs. It is its own Go module because those projects pin other versions of the Envoy
// and Kubernetes modules than tether does; `make test` runs it.
package recipetest
