package config

import (
	"slices"

	"github.com/tether-dev/tether/pkg/registry"
)

// Registry maps the config's services and instances to registry values, ready for
// (*registry.Registry).Apply. Services keep file order; instances come service by service in
// file order. Instances carry no health (Apply keeps or initialises it). The returned slices
// are new and owned by the caller.
func (c *Config) Registry() ([]registry.Service, []registry.Instance) {
	services := make([]registry.Service, 0, len(c.Services))
	var instances []registry.Instance
	for _, s := range c.Services {
		bodyMode := s.BodyMode
		if bodyMode == "" {
			bodyMode = c.ExtProc.BodyMode
		}
		balancing := s.Balancing
		if balancing == "" { // a Config built by hand rather than by Parse
			balancing = registry.BalanceRoundRobin
			if s.Affinity == registry.AffinityHash {
				balancing = registry.BalanceConsistentHash
			}
		}
		services = append(services, registry.Service{
			Name:                    s.Name,
			Match:                   registry.Match{Authorities: slices.Clone(s.Match.Authorities), PathPrefix: s.Match.PathPrefix},
			Affinity:                s.Affinity,
			Balancing:               balancing,
			SessionsPerInstance:     s.SessionsPerInstance,
			RequestSlotsPerInstance: s.RequestSlotsPerInstance,
			StreamsPerInstance:      streams(s),
			SessionTTL:              s.SessionTTL,
			IdleTimeout:             s.IdleTimeout,
			MaxLifetime:             s.MaxLifetime,
			DisableSessionIDReuse:   s.DisableSessionIDReuse,
			Cookie: registry.Cookie{
				Name:     s.Cookie.Name,
				Path:     s.Cookie.Path,
				Secure:   s.Cookie.Secure,
				HTTPOnly: s.Cookie.HTTPOnly,
				SameSite: s.Cookie.SameSite,
				// A Config built by hand may leave Lifetime empty: permanent.
				SessionLifetime: s.Cookie.Lifetime == CookieSession,
			},
			Sticky:            registry.Sticky{UpstreamCookie: s.Sticky.UpstreamCookie},
			HeaderField:       s.HeaderField,
			SSE:               registry.SSE{Path: s.SSE.Path, SessionParam: s.SSE.SessionParam},
			MCPHandle:         mcpHandle(s.MCPHandle),
			DCRFile:           s.DCRFile,
			HashBalanceFactor: s.HashBalanceFactor,
			UpstreamHTTP2:     s.Upstream.Protocol == ProtocolHTTP2,
			FullDuplexBodies:  bodyMode == BodyModeFullDuplex,
			ConnectTimeout:    s.Upstream.ConnectTimeout,
			HealthCheck: registry.HealthCheck{
				Path:               s.HealthCheck.Path,
				Interval:           s.HealthCheck.Interval,
				Timeout:            s.HealthCheck.Timeout,
				HealthyThreshold:   s.HealthCheck.HealthyThreshold,
				UnhealthyThreshold: s.HealthCheck.UnhealthyThreshold,
			},
		})
		for _, in := range s.Instances {
			instances = append(instances, registry.Instance{
				Service:  s.Name,
				ID:       in.ID,
				Address:  in.Address,
				HTTPPort: in.Ports.HTTP,
				SIPPort:  in.Ports.SIP,
				Weight:   uint32(in.Weight),
				Zone:     in.Zone,
				State:    in.State,
			})
		}
	}
	return services, instances
}

// DefaultService returns the registry value of a service named name with the given affinity
// and every other field at the config file's default: what a file naming only those two
// would load as. For services built in code (tests, examples); the engine applies no defaults
// of its own.
func DefaultService(name string, mode registry.AffinityMode) registry.Service {
	var s Service
	s.setDefaults()
	s.Name, s.Affinity = name, mode
	svcs, _ := (&Config{Services: []Service{s}}).Registry()
	return svcs[0]
}

// mcpHandle maps handle-affinity settings; off (no header) is the zero value.
func mcpHandle(h MCPHandle) registry.MCPHandle {
	if h.Header == "" {
		return registry.MCPHandle{}
	}
	return registry.MCPHandle{Header: h.Header, LearnHeader: h.LearnHeader, InstancePrefix: h.InstancePrefix,
		PrefixSeparator: h.PrefixSeparator, MintTools: h.MintTools}
}

// streams is the stream cap of a service: its streamsPerInstance for the MCP modes, none for
// the others (their long-lived responses are requests).
func streams(s Service) int {
	if s.Affinity != registry.AffinityMCPStreamable && s.Affinity != registry.AffinityMCPSSE {
		return 0
	}
	return s.StreamsPerInstance
}
