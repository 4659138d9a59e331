// Package wire is tether's wire vocabulary: the names tether and its data planes agree on
// (headers, metadata keys, gRPC service names), the base ext_proc processing mode, and the one
// table that maps each rejection class to its HTTP status, gRPC code and retry-after. It is a
// leaf: it imports no tether package and no Envoy type, so the engine (pkg/affinity), the
// protocol boundaries (pkg/extproc, pkg/sipdecide, pkg/api), the xDS builders (pkg/xds) and the
// config (pkg/config) all share it.
//
// Names whose value the operator may change (the destination header, the metadata namespace,
// the served-host key) are the defaults pkg/config applies; the other packages take the
// configured value and fall back to these names only when built in code (tests, examples).
package wire
