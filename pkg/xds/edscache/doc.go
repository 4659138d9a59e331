// Package edscache is tether's endpoint cache: the ClusterLoadAssignments every xDS node of a
// server shares, served through go-control-plane's state-of-the-world and delta ADS servers
// (Cache, a go-control-plane cache.Cache), and the ACK filter that keeps Envoy's plain EDS ACKs
// from the state-of-the-world server (Filters).
//
// Both depend on behaviour of go-control-plane's server that its documentation does not
// promise; TestGoControlPlaneServerContract lists it and holds the go-control-plane version in
// go.mod to it, so an upgrade that changes it fails there first.
package edscache
