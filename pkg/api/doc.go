// Package api serves tether's operator and application API on one listener: the read-only admin
// endpoints (/healthz, /readyz, /v1/services, /v1/services/{name}/instances), the SessionAPI and
// the instance admin API, each both as gRPC (tether.v1 protos) and as HTTP/JSON, guarded by
// bearer-token auth. gRPC status codes and HTTP status codes appear only in this package.
package api
