package envoyharness

import (
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"

	"google.golang.org/protobuf/types/known/structpb"
)

// Endpoint is one EDS host of a cluster.
type Endpoint struct {
	// Address is ip:port (IPv6 bracketed), the form override_host compares against.
	Address string
	// Healthy is false for EDS health status UNHEALTHY, DRAINING or TIMEOUT.
	Healthy bool
	// Priority is the locality priority (0 first; tether puts standby instances at 1).
	Priority uint32
}

// EndpointSource gives the current EDS membership of a cluster. Implementations must be safe
// for concurrent use; the harness calls Endpoints once per request.
type EndpointSource interface {
	Endpoints(cluster string) []Endpoint
}

// UpstreamProtocols is implemented by an EndpointSource that knows each cluster's upstream
// protocol (XDSEndpoints reads it from CDS). UpstreamHTTP2 reports that the harness must
// speak HTTP/2 with prior knowledge to the cluster's hosts; otherwise it speaks HTTP/1.1.
type UpstreamProtocols interface {
	UpstreamHTTP2(cluster string) bool
}

// HTTP1Trailers is implemented by an EndpointSource that knows whether a cluster's HTTP/1
// protocol options set enable_trailers (XDSEndpoints reads it from CDS). Without it, or when
// it reports false, HTTP/1 upstream trailers are dropped, as Envoy's HTTP/1 codec does by
// default.
type HTTP1Trailers interface {
	HTTP1Trailers(cluster string) bool
}

// EndpointsFunc adapts a function to EndpointSource.
type EndpointsFunc func(cluster string) []Endpoint

// Endpoints calls f.
func (f EndpointsFunc) Endpoints(cluster string) []Endpoint { return f(cluster) }

// overrideHost models envoy.load_balancing_policies.override_host: the sources (dynamic
// metadata first, then the header) are concatenated into one ip:port list; the first entry
// present in the cluster's EDS membership wins — health is not checked. Without such an entry
// the fallback policy picks (round robin here), silently. fallback reports that case.
type overrideHost struct {
	metadataNS, metadataKey, header string
	rr                              sync.Map // cluster → *atomic.Uint64
}

func (o *overrideHost) pick(cluster string, eps []Endpoint, md map[string]*structpb.Struct, headers *headerMap) (addr string, fallback bool) {
	var list []string
	if ns := md[o.metadataNS]; ns != nil {
		if v, ok := ns.GetFields()[o.metadataKey]; ok {
			if s, isStr := v.GetKind().(*structpb.Value_StringValue); isStr {
				list = appendHostList(list, s.StringValue)
			}
		}
	}
	if v := headers.first(o.header); v != "" { // first header value only
		list = appendHostList(list, v)
	}
	// The lookup is exact, by the candidate string as given, in a map keyed by each host's
	// canonical address (Address::Ipv4/Ipv6Instance::asString: inet_ntop for IPv6, so
	// lower-case and zero-compressed; load_balancer.cc, OverrideHostLoadBalancer findHost
	// over crossPriorityHostMap): "[2001:DB8:0::1]:80" never matches, and the host an EDS
	// entry written that way becomes is "[2001:db8::1]:80".
	for _, cand := range list {
		for _, ep := range eps {
			if canonicalAddress(ep.Address) == cand {
				return cand, false
			}
		}
	}
	return o.fallback(cluster, eps), true
}

// canonicalAddress is an ip:port as Envoy prints a host's address; unparsable strings are
// returned unchanged.
func canonicalAddress(addr string) string {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return addr
	}
	return ap.String()
}

func appendHostList(list []string, v string) []string {
	for _, part := range strings.Split(v, ",") {
		if p := strings.TrimSpace(part); p != "" {
			list = append(list, p)
		}
	}
	return list
}

// fallback is Envoy's round robin over the healthy hosts of the first priority that has any
// (a simplification of priority spill-over without overprovisioning factor), or over all hosts
// of that priority in panic mode (fewer than 50 % healthy, Envoy's default
// healthy_panic_threshold). "" when the cluster is empty.
func (o *overrideHost) fallback(cluster string, eps []Endpoint) string {
	if len(eps) == 0 {
		return ""
	}
	prio, found := uint32(0), false
	for _, ep := range eps {
		if ep.Healthy && (!found || ep.Priority < prio) {
			prio, found = ep.Priority, true
		}
	}
	if !found { // nothing healthy anywhere: panic over the first priority
		prio = eps[0].Priority
		for _, ep := range eps {
			prio = min(prio, ep.Priority)
		}
	}
	var all, healthy []Endpoint
	for _, ep := range eps {
		if ep.Priority != prio {
			continue
		}
		all = append(all, ep)
		if ep.Healthy {
			healthy = append(healthy, ep)
		}
	}
	pool := healthy
	if 2*len(healthy) < len(all) {
		pool = all
	}
	c, _ := o.rr.LoadOrStore(cluster, new(atomic.Uint64))
	n := c.(*atomic.Uint64).Add(1) - 1
	return canonicalAddress(pool[n%uint64(len(pool))].Address)
}
