package wire

import "time"

// How the data plane watches tether's control-plane listeners: the generated Envoy bootstrap
// (pkg/xds) sets these on the ext_proc and xDS clusters, and tether's drain (pkg/extproc,
// cmd/tether serve) and the Envoy stand-in (internal/envoyharness) rely on the same numbers.
const (
	// HealthCheckInterval and HealthCheckTimeout are the grpc.health.v1 check of each replica.
	HealthCheckInterval = 5 * time.Second
	HealthCheckTimeout  = time.Second
	// HealthCheckUnhealthyThreshold is how many failed (or NOT_SERVING) checks in a row take a
	// replica out of the cluster; HealthCheckHealthyThreshold how many successes bring it back.
	HealthCheckUnhealthyThreshold = 2
	HealthCheckHealthyThreshold   = 1
	// KeepaliveInterval and KeepaliveTimeout are the HTTP/2 PINGs Envoy sends on its
	// connections to tether (connection_keepalive), with or without streams.
	KeepaliveInterval = 30 * time.Second
	KeepaliveTimeout  = 5 * time.Second
)

// HealthCheckMoveAway is the longest Envoy may keep opening new side streams to a replica
// after it turned NOT_SERVING: the check that will see it may start up to one interval later,
// and it takes HealthCheckUnhealthyThreshold checks, each up to HealthCheckTimeout, to eject
// it.
func HealthCheckMoveAway() time.Duration {
	return HealthCheckUnhealthyThreshold*HealthCheckInterval + HealthCheckTimeout
}
