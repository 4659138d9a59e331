// Package affinity is tether's decision engine: for each protocol-neutral Request it finds the
// service, extracts the session key (cookie, header field, MCP session id, DCR key), looks the
// session up or places a new one under the per-instance session and request quotas, and returns
// a Decision or a *Reject. It imports no Envoy or gRPC types.
package affinity
