// Package recipetest decodes the attachment recipes under deploy/ (envoy-gateway, istio)
// strictly into their projects' own Go API types — Envoy Gateway's api/v1alpha1, the Gateway
// API, the Gateway API Inference Extension, Istio's networking types, Kubernetes core — and checks
// that they say what tether needs. It is its own Go module because those projects pin other
// versions of the Envoy and Kubernetes modules than tether does, and it does not import tether
// (so tether's dependencies never have to be tidied here); `make test` runs it. The Envoy
// configuration inside the Istio EnvoyFilter is held to tether's own builders by deploy/istio's
// test in the root module.
package recipetest
