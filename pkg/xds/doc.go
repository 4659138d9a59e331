// Package xds turns tether's registry into Envoy configuration and serves it over ADS.
//
// The package has three parts (and two caches), along the lines of contour's internal/envoy/v3 (builders),
// internal/xdscache (resource policy) and SnapshotHandler (publishing):
//
//   - Pure builders (Cluster, ClusterLoadAssignment, ExternalProcessor, RouteConfiguration,
//     Listener, Bootstrap): functions from registry values and Params to Envoy protos. They
//     never read global state, never mutate their inputs and always return resources in a
//     deterministic (sorted) order, so the same model yields byte-identical output.
//   - The resource policy (resources.go): Resources(profile, snapshot) is the one definition of
//     what a client of a Profile (a Kind — Envoy or proxyless gRPC — and its Params) receives.
//     Build and GRPCResources are its two common cases. node.go maps a connecting node to its
//     profile.
//   - The publisher (publish.go) builds each profile's resources from the same per-service and
//     shared functions Resources uses, incrementally, diffs them against what it published,
//     checks every complete snapshot, and pushes in Envoy's warming order; the Server
//     (server.go) is the lifecycle: options, the ADS gRPC server, following and debouncing the
//     registry, ACK/NACK status.
//   - The state-of-the-world cache (sotwcache.go) serves clusters, listeners and routes, each
//     marshalled once per version and shared by every client's response.
//   - The endpoint cache (package edscache) serves every node's ClusterLoadAssignments: persistent
//     watches, one pass over them per change, each CLA marshalled once, content-derived versions
//     (so replicas fed the same registry state serve identical xDS); with it, the ACK filter
//     (edscache.Filters) keeps Envoy's plain EDS ACKs, which name every cluster, from
//     go-control-plane's server.
//
// Envoy proto types never leave this package and pkg/envoyvalidate; callers outside speak in
// registry types, Params and YAML bytes.
//
// # How a request is pinned to an instance
//
// Every service becomes one EDS cluster whose load_balancing_policy is
// envoy.load_balancing_policies.override_host. tether's ext_proc server answers
// request_headers with the chosen instance's ip:port both as dynamic metadata
// (envoy.lb/x-gateway-destination-endpoint) and as the x-gateway-destination-endpoint
// header; override_host reads the metadata first, then the header, and picks that host if it
// is in the cluster's EDS membership. When the address is missing or not in EDS it falls back,
// silently, to the policy matching the service's balancing mode (round_robin, least_request or
// maglev). See the envoy/README.md file for every choice in the generated configuration.
package xds
