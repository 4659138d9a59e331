// Package mcpe2e holds tether's MCP end-to-end tests: real MCP servers built with the official
// Go SDK (examples/mcp/replicas/mcpreplica) and TypeScript SDK (internal/mcpts) behind a data plane that
// runs tether's real ext_proc server, engine, registry and memstore.Store, with Go SDK and
// TypeScript SDK clients on the other side.
//
// Every scenario runs as two subtests named after the data plane (internal/e2e.Kinds):
// "harness", the Envoy-faithful harness (internal/envoyharness) with the routes tether generates
// and the endpoints tether serves over ADS, and "envoy", a real Envoy started from tether's
// generated bootstrap, run only when ENVOY_BIN names an Envoy binary (make e2e-envoy). The
// scenarios talk to the data plane's URL only, so they run unchanged against both.
//
// The package has no non-test code besides this comment.
package mcpe2e
