package config

import (
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"time"
)

// Discovery kinds: where a service's instances come from besides services[].instances.
const (
	DiscoveryKubernetes = "kubernetes"
	DiscoveryXDS        = "xds"
	DiscoveryDNS        = "dns"
)

// Discovery configures the connections the discovery sources share.
//
//	field                                   default                 allowed
//	discovery.kubernetes.kubeconfig         "" (in-cluster)         path of a kubeconfig file
//	discovery.kubernetes.context            "" (current context)    context name in the kubeconfig
//	discovery.xds.server                    "" (required by a services[].discovery.xds)
//	                                                                host:port of an ADS server
//	discovery.xds.nodeID                    tether                  non-empty
//	discovery.xds.nodeCluster               tether                  non-empty
//	discovery.xds.tls.enabled               false (plain text)      true: TLS to the ADS server (system roots unless caFile)
//	discovery.xds.tls.caFile                "" (system roots)       PEM CA bundle that signs the server's certificate
//	discovery.xds.tls.certFile, .keyFile    "" (no client cert)     both or neither: the client certificate for mTLS,
//	                                                                read again on every connection (rotation needs no reload)
//	discovery.xds.tls.serverName            "" (the server's host)  name checked in the server's certificate (and sent as SNI)
//	discovery.gatewayAPI.enabled            false                   true turns the Gateway API source on
//	discovery.gatewayAPI.gatewayClasses     []                      GatewayClass names: routes attached to their Gateways
//	discovery.gatewayAPI.routeSelector      ""                      label selector on HTTPRoutes (as for kubernetes.selector)
//	                                                                (enabled needs gatewayClasses or routeSelector)
//	discovery.gatewayAPI.namespace          "" (all namespaces)     a namespace name
//	discovery.gatewayAPI.controllerName     tether.dev/session-persistence
//	                                                                domain/path written in the routes' status.parents
//
// Per service (at most one of kubernetes, xds, dns):
//
//	services[].discovery.kubernetes.namespace  (required)           a namespace name
//	services[].discovery.kubernetes.service    (one of service, selector)
//	                                                                the Service whose EndpointSlices to follow
//	services[].discovery.kubernetes.selector   (one of service, selector)
//	                                                                label selector on EndpointSlices: k=v, k!=v, k, !k, comma-separated
//	services[].discovery.kubernetes.ports.http http                 port name; "" = none
//	services[].discovery.kubernetes.ports.sip  "" (none)            port name
//	services[].discovery.xds.cluster           (required)           a cluster name the ADS server publishes
//	services[].discovery.dns.name              (required)           a DNS name
//	services[].discovery.dns.type              A                    A|AAAA|SRV
//	services[].discovery.dns.ports.http        0                    1..65535 for A/AAAA (SRV gives the port)
//	services[].discovery.dns.ports.sip         0                    0..65535, A/AAAA only
//	services[].discovery.dns.server            "" (resolv.conf)     host:port of a DNS server
//	services[].discovery.dns.minRefresh        1s                   100ms..1h: the floor under a record's TTL
//	services[].discovery.dns.maxRefresh        5m                   ≥ minRefresh, ≤ 24h: the cap over it
//
// Discovered instances merge with services[].instances and the admin API's under the registry's
// precedence (package registry, Precedence): an id in services[].instances wins over the same id
// registered through the API, which wins over a discovered one.
//
// The Gateway API source (discovery.gatewayAPI, through discovery.kubernetes's connection)
// declares whole services, one per HTTPRoute rule with sessionPersistence (package
// discovery/gatewayapi has the mapping); a service of the same name in services[] wins.
type Discovery struct {
	Kubernetes KubernetesConnection `yaml:"kubernetes"`
	XDS        XDSConnection        `yaml:"xds"`
	GatewayAPI GatewayAPISource     `yaml:"gatewayAPI"`
}

// GatewayAPISource makes tether services of the HTTPRoute rules that ask for session
// persistence, on the routes it selects: those attached to a Gateway of one of GatewayClasses,
// and those whose labels match RouteSelector.
type GatewayAPISource struct {
	Enabled        bool     `yaml:"enabled"`
	GatewayClasses []string `yaml:"gatewayClasses"`
	RouteSelector  string   `yaml:"routeSelector"`
	Namespace      string   `yaml:"namespace"`
	ControllerName string   `yaml:"controllerName"`
}

// DefaultGatewayControllerName is discovery.gatewayAPI.controllerName's default.
const DefaultGatewayControllerName = "tether.dev/session-persistence"

// KubernetesConnection says how tether reaches the Kubernetes API server.
type KubernetesConnection struct {
	// Kubeconfig is a kubeconfig path (resolved against the config file's directory); ""
	// means the in-cluster service account.
	Kubeconfig string `yaml:"kubeconfig"`
	// Context picks a context of Kubeconfig; "" is its current context.
	Context string `yaml:"context"`
}

// XDSConnection is the existing control plane tether subscribes to as an ADS client.
type XDSConnection struct {
	// Server is the ADS server's host:port (plain-text gRPC unless TLS.Enabled).
	Server string `yaml:"server"`
	// TLS is the client TLS to Server (a mesh's control plane usually wants mTLS).
	TLS XDSTLS `yaml:"tls"`
	// NodeID and NodeCluster identify tether to that server.
	NodeID      string `yaml:"nodeID"`
	NodeCluster string `yaml:"nodeCluster"`
}

// XDSTLS is the client TLS of the ADS connection; relative paths resolve against the config
// file's directory.
type XDSTLS struct {
	Enabled    bool   `yaml:"enabled"`
	CAFile     string `yaml:"caFile"`
	CertFile   string `yaml:"certFile"`
	KeyFile    string `yaml:"keyFile"`
	ServerName string `yaml:"serverName"`
}

// ServiceDiscovery is where one service's instances are discovered; Kind says which block was
// given ("" when none).
type ServiceDiscovery struct {
	Kubernetes KubernetesSource `yaml:"kubernetes"`
	XDS        XDSSource        `yaml:"xds"`
	DNS        DNSSource        `yaml:"dns"`

	// Kind is DiscoveryKubernetes, DiscoveryXDS, DiscoveryDNS or "", set by Parse.
	Kind string `yaml:"-"`
}

// KubernetesSource follows the EndpointSlices of one Service (or of a label selector).
type KubernetesSource struct {
	Namespace string    `yaml:"namespace"`
	Service   string    `yaml:"service"`
	Selector  string    `yaml:"selector"`
	Ports     PortNames `yaml:"ports"`
}

// PortNames are the EndpointSlice port names that carry HTTP and SIP. A slice whose only port
// has no name (a single-port Service) serves HTTP when HTTP is not found by name.
type PortNames struct {
	HTTP string `yaml:"http"`
	SIP  string `yaml:"sip"`
}

// XDSSource takes the endpoints of one cluster from the discovery.xds server.
type XDSSource struct {
	Cluster string `yaml:"cluster"`
}

// DNS record types a DNS source resolves.
const (
	DNSTypeA    = "A"
	DNSTypeAAAA = "AAAA"
	DNSTypeSRV  = "SRV"
)

// DNSSource resolves one name, re-resolving when its records' TTL runs out.
type DNSSource struct {
	Name       string        `yaml:"name"`
	Type       string        `yaml:"type"`
	Ports      Ports         `yaml:"ports"`
	Server     string        `yaml:"server"`
	MinRefresh time.Duration `yaml:"minRefresh"`
	MaxRefresh time.Duration `yaml:"maxRefresh"`
}

func defaultDiscovery() Discovery {
	return Discovery{
		XDS:        XDSConnection{NodeID: "tether", NodeCluster: "tether"},
		GatewayAPI: GatewayAPISource{ControllerName: DefaultGatewayControllerName},
	}
}

func defaultServiceDiscovery() ServiceDiscovery {
	return ServiceDiscovery{
		Kubernetes: KubernetesSource{Ports: PortNames{HTTP: "http"}},
		DNS:        DNSSource{Type: DNSTypeA, MinRefresh: time.Second, MaxRefresh: 5 * time.Minute},
	}
}

var (
	dnsLabelRe   = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	labelKeyRe   = regexp.MustCompile(`^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	labelValueRe = regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$`)
	// controllerNameRe is the Gateway API's GatewayController format: a domain, a slash, a path.
	controllerNameRe = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9/\-._~%!$&'()*+,;=:]+$`)
	subdomainRe      = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`)
	dnsNameRe        = regexp.MustCompile(`^([A-Za-z0-9_]([-A-Za-z0-9_]*[A-Za-z0-9])?\.)*[A-Za-z0-9_]([-A-Za-z0-9_]*[A-Za-z0-9])?\.?$`)
)

// discovery validates the top-level discovery block.
func (v *validator) discovery() {
	d := &v.cfg.Discovery
	d.Kubernetes.Kubeconfig = v.resolve(d.Kubernetes.Kubeconfig)
	if d.XDS.Server != "" {
		if _, ok := v.hostPort("discovery.xds.server", d.XDS.Server); ok && strings.HasSuffix(d.XDS.Server, ":0") {
			v.errorf("discovery.xds.server", "%q: port 0 is not a server's port", d.XDS.Server)
		}
	}
	t := &d.XDS.TLS
	t.CAFile, t.CertFile, t.KeyFile = v.resolve(t.CAFile), v.resolve(t.CertFile), v.resolve(t.KeyFile)
	if (t.CertFile == "") != (t.KeyFile == "") {
		v.errorf("discovery.xds.tls", "set both certFile and keyFile, or neither")
	}
	for _, f := range []struct{ path, file string }{
		{"discovery.xds.tls.caFile", t.CAFile}, {"discovery.xds.tls.certFile", t.CertFile}, {"discovery.xds.tls.keyFile", t.KeyFile},
	} {
		if f.file == "" {
			continue
		}
		if !t.Enabled {
			v.errorf(f.path, "set discovery.xds.tls.enabled: true to use it")
		}
		if _, err := os.Stat(f.file); err != nil {
			v.errorf(f.path, "cannot read: %v", err)
		}
	}
	if t.ServerName != "" && !t.Enabled {
		v.errorf("discovery.xds.tls.serverName", "set discovery.xds.tls.enabled: true to use it")
	}
	if d.XDS.NodeID == "" {
		v.errorf("discovery.xds.nodeID", "must not be empty")
	}
	if d.XDS.NodeCluster == "" {
		v.errorf("discovery.xds.nodeCluster", "must not be empty")
	}
	v.gatewayAPI(&d.GatewayAPI)
}

// gatewayAPI validates discovery.gatewayAPI.
func (v *validator) gatewayAPI(g *GatewayAPISource) {
	const p = "discovery.gatewayAPI"
	if !g.Enabled {
		for _, f := range []string{"gatewayClasses", "routeSelector", "namespace", "controllerName"} {
			if v.set(p + "." + f) {
				v.errorf(p+"."+f, "has no effect without %s.enabled: true", p)
			}
		}
		return
	}
	if len(g.GatewayClasses) == 0 && g.RouteSelector == "" {
		v.errorf(p, "give gatewayClasses or routeSelector: which HTTPRoutes are tether's")
	}
	for i, c := range g.GatewayClasses {
		if len(c) > 253 || !subdomainRe.MatchString(c) {
			v.errorf(fmt.Sprintf("%s.gatewayClasses[%d]", p, i), "%q is not a GatewayClass name", c)
		}
	}
	v.selector(p+".routeSelector", g.RouteSelector)
	if g.Namespace != "" && (len(g.Namespace) > 63 || !dnsLabelRe.MatchString(g.Namespace)) {
		v.errorf(p+".namespace", "%q is not a namespace name", g.Namespace)
	}
	if len(g.ControllerName) > 253 || !controllerNameRe.MatchString(g.ControllerName) {
		v.errorf(p+".controllerName", "%q is not a controller name (domain/path, e.g. %s)", g.ControllerName, DefaultGatewayControllerName)
	}
}

// serviceDiscovery validates services[i].discovery and sets its Kind.
func (v *validator) serviceDiscovery(p string, sd *ServiceDiscovery) {
	p += ".discovery"
	var kinds []string
	for _, k := range []string{DiscoveryKubernetes, DiscoveryXDS, DiscoveryDNS} {
		if v.set(p + "." + k) {
			kinds = append(kinds, k)
		}
	}
	switch len(kinds) {
	case 0:
		return
	case 1:
		sd.Kind = kinds[0]
	default:
		v.errorf(p, "give one of kubernetes, xds, dns, not %s", strings.Join(kinds, " and "))
		return
	}
	switch sd.Kind {
	case DiscoveryKubernetes:
		v.kubernetesDiscovery(p+".kubernetes", &sd.Kubernetes)
	case DiscoveryXDS:
		v.xdsDiscovery(p, &sd.XDS)
	case DiscoveryDNS:
		v.dnsDiscovery(p+".dns", &sd.DNS)
	}
}

// kubernetesDiscovery validates a service's discovery.kubernetes (at kp).
func (v *validator) kubernetesDiscovery(kp string, k *KubernetesSource) {
	switch {
	case k.Namespace == "":
		v.errorf(kp+".namespace", "required")
	case len(k.Namespace) > 63 || !dnsLabelRe.MatchString(k.Namespace):
		v.errorf(kp+".namespace", "%q is not a namespace name", k.Namespace)
	}
	switch {
	case k.Service == "" && k.Selector == "":
		v.errorf(kp, "give service (a Service name) or selector (a label selector)")
	case k.Service != "" && k.Selector != "":
		v.errorf(kp+".selector", "give service or selector, not both")
	case k.Service != "" && (len(k.Service) > 63 || !dnsLabelRe.MatchString(k.Service)):
		v.errorf(kp+".service", "%q is not a Service name", k.Service)
	default:
		v.selector(kp+".selector", k.Selector)
	}
	if k.Ports.HTTP == "" && k.Ports.SIP == "" {
		v.errorf(kp+".ports", "name at least one of http, sip")
	}
	if k.Ports.HTTP != "" && k.Ports.HTTP == k.Ports.SIP {
		v.errorf(kp+".ports.sip", "%q is also the http port", k.Ports.SIP)
	}
}

// xdsDiscovery validates a service's discovery.xds (p is the discovery block's path).
func (v *validator) xdsDiscovery(p string, x *XDSSource) {
	if x.Cluster == "" {
		v.errorf(p+".xds.cluster", "required")
	}
	if v.cfg.Discovery.XDS.Server == "" {
		v.errorf(p+".xds", "needs discovery.xds.server (the ADS server to subscribe to)")
	}
}

// dnsDiscovery validates a service's discovery.dns (at dp).
func (v *validator) dnsDiscovery(dp string, d *DNSSource) {
	switch {
	case d.Name == "":
		v.errorf(dp+".name", "required")
	case len(d.Name) > 253 || !dnsNameRe.MatchString(d.Name):
		v.errorf(dp+".name", "%q is not a DNS name", d.Name)
	}
	v.oneOf(dp+".type", d.Type, DNSTypeA, DNSTypeAAAA, DNSTypeSRV)
	switch d.Type {
	case DNSTypeSRV:
		if d.Ports.HTTP != 0 || d.Ports.SIP != 0 {
			v.errorf(dp+".ports", "SRV records carry the port; leave ports out")
		}
	default:
		v.intRange(dp+".ports.http", d.Ports.HTTP, 0, 65535)
		v.intRange(dp+".ports.sip", d.Ports.SIP, 0, 65535)
		if d.Ports.HTTP == 0 && d.Ports.SIP == 0 {
			v.errorf(dp+".ports", "an A or AAAA source needs ports.http or ports.sip")
		}
	}
	if d.Server != "" {
		if h, ok := v.hostPort(dp+".server", d.Server); ok {
			if _, err := netip.ParseAddr(h); err != nil {
				v.errorf(dp+".server", "%q: the DNS server must be an IP address", d.Server)
			}
		}
	}
	v.durRange(dp+".minRefresh", d.MinRefresh, 100*time.Millisecond, time.Hour)
	v.durRange(dp+".maxRefresh", d.MaxRefresh, d.MinRefresh, 24*time.Hour)
}

// selector checks the label selector sel at path, if set.
func (v *validator) selector(path, sel string) {
	if sel == "" {
		return
	}
	if err := checkSelector(sel); err != nil {
		v.errorf(path, "%q: %v", sel, err)
	}
}

// checkSelector accepts the equality-based label selector syntax: comma-separated k=v, k==v,
// k!=v, k (exists) and !k (does not exist).
func checkSelector(sel string) error {
	for _, term := range strings.Split(sel, ",") {
		term = strings.TrimSpace(term)
		key, val, op := term, "", ""
		for _, o := range []string{"!=", "==", "="} {
			if i := strings.Index(term, o); i >= 0 {
				key, val, op = strings.TrimSpace(term[:i]), strings.TrimSpace(term[i+len(o):]), o
				break
			}
		}
		if op == "" {
			key = strings.TrimPrefix(key, "!")
		}
		if !labelKeyRe.MatchString(key) || len(key) > 317 {
			return fmt.Errorf("%q is not a label key", key)
		}
		if op != "" && (len(val) > 63 || !labelValueRe.MatchString(val)) {
			return fmt.Errorf("%q is not a label value", val)
		}
	}
	return nil
}
