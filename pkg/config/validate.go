package config

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/quota"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session/redisstore"
)

var (
	serviceNameRe  = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	instanceIDRe   = regexp.MustCompile(`^[A-Za-z0-9]([-._A-Za-z0-9]*[A-Za-z0-9])?$`)
	headerFieldRe  = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]{4,39}$`)
	headerNameRe   = regexp.MustCompile(`^[a-z0-9!#$%&'*+.^_|~-]+$`)
	cookieNameRe   = regexp.MustCompile("^[!#$%&'*+\\-.^_`|~0-9A-Za-z]+$")
	authorityRe    = regexp.MustCompile(`^(\*\.)?[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?$`)
	listenerHostRe = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?$`)
)

// validator checks a decoded Config, fills the defaults that depend on other fields and
// resolves relative paths. Errors are placed on the line of the field, or of its nearest
// enclosing field present in the file.
type validator struct {
	cfg    *Config
	lines  map[string]int
	errs   *errList
	policy *registry.AddressPolicy // instances' addresses (registry.allowedNetworks)
}

// line returns the line of path or of its nearest ancestor present in the file (0 if none).
func (v *validator) line(path string) int {
	for path != "" {
		if l, ok := v.lines[path]; ok {
			return l
		}
		i := max(strings.LastIndexByte(path, '.'), strings.LastIndexByte(path, '['))
		if i < 0 {
			break
		}
		path = path[:i]
	}
	return 0
}

// set reports whether path was given in the file.
func (v *validator) set(path string) bool { _, ok := v.lines[path]; return ok }

func (v *validator) errorf(path, format string, args ...any) {
	v.errs.add(v.line(path), path, format, args...)
}

// warnf records a setting that loads but may not do what its author meant (Config.Warnings).
func (v *validator) warnf(path, format string, args ...any) {
	w := fmt.Sprintf("%s: %s", path, fmt.Sprintf(format, args...))
	if l := v.line(path); l > 0 {
		w = fmt.Sprintf("line %d: %s", l, w)
	}
	v.cfg.Warnings = append(v.cfg.Warnings, w)
}

func (v *validator) intRange(path string, val, lo, hi int) {
	if val < lo || val > hi {
		v.errorf(path, "%d is out of range %d..%d", val, lo, hi)
	}
}

func (v *validator) durRange(path string, val, lo, hi time.Duration) {
	if val < lo || val > hi {
		v.errorf(path, "%s is out of range %s..%s", fmtDuration(val), fmtDuration(lo), fmtDuration(hi))
	}
}

func (v *validator) oneOf(path, val string, allowed ...string) {
	if !slices.Contains(allowed, val) {
		v.errorf(path, "%q is not one of %s", val, strings.Join(allowed, ", "))
	}
}

func (v *validator) slashPath(path, val string) {
	if !strings.HasPrefix(val, "/") {
		v.errorf(path, "%q must start with /", val)
	}
}

// resolve joins a relative path to the config file's directory.
func (v *validator) resolve(p string) string {
	if p == "" || filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(filepath.Dir(v.cfg.File), p)
}

// fmtDuration prints a duration without trailing zero units: 6h, 30m, 1m30s, 500ms.
func fmtDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// hostPort checks a host:port listener address and returns its host. Port 0 is allowed.
func (v *validator) hostPort(path, val string) (host string, ok bool) {
	h, port, err := net.SplitHostPort(val)
	if err != nil {
		v.errorf(path, "%q is not host:port", val)
		return "", false
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		v.errorf(path, "%q: port must be a number 0..65535", val)
		return "", false
	}
	if h != "" && !listenerHostRe.MatchString(h) {
		if _, err := netip.ParseAddr(h); err != nil {
			v.errorf(path, "%q: %q is neither an IP address nor a host name", val, h)
			return "", false
		}
	}
	return h, true
}

// isLoopback reports whether a listener host only accepts local connections.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

func (v *validator) validate() {
	c := v.cfg
	v.apiVersion()
	v.listeners()
	v.oneOf("log.format", c.Log.Format, "text", "json")
	v.oneOf("log.level", c.Log.Level, "debug", "info", "warn", "error")
	v.store()
	v.extProc()
	v.newSessions()
	if d := c.ExtProc.DefaultService; d != "" && (len(d) > 63 || !serviceNameRe.MatchString(d)) {
		v.errorf("extProc.defaultService", "%q is not a service name", d)
	}
	v.hostPort("envoy.listenerAddress", c.Envoy.ListenerAddress)
	v.hostPort("envoy.adminAddress", c.Envoy.AdminAddress)
	v.replicas()
	v.discovery()
	v.prefixes("registry.allowedNetworks", c.RegistryOptions.AllowedNetworks, "10.0.0.0/8, 127.0.0.1/32")
	v.policy = c.AddressPolicy()
	names := map[string]int{}
	for i := range c.Services {
		v.service(i, names)
	}
	v.matches()
	v.auth(names)
	v.api()
	v.tls()
	v.autoscaling()
	v.intRange("runtime.gcHeapFloorMiB", c.Runtime.GCHeapFloorMiB, 0, 65536)
}

func (v *validator) apiVersion() {
	switch c := v.cfg; {
	case c.APIVersion == "":
		v.errorf("apiVersion", "required; set apiVersion: %s", APIVersion)
	case c.APIVersion != APIVersion:
		v.errorf("apiVersion", "%q is not supported (want %s)", c.APIVersion, APIVersion)
	}
}

// store checks the store settings shared by the backends, then Redis's.
func (v *validator) store() {
	st := &v.cfg.Store
	v.durRange("store.snapshotInterval", st.SnapshotInterval, time.Second, 24*time.Hour)
	v.durRange("store.retention", st.Retention, 0, 720*time.Hour)
	st.SnapshotPath = v.resolve(st.SnapshotPath)
	v.oneOf("store.onCorruptSnapshot", st.OnCorruptSnapshot, SnapshotFail, SnapshotMoveAside)
	v.storeRedis()
}

// extProc checks the ext_proc server's settings and the shutdown they end with.
func (v *validator) extProc() {
	c := v.cfg
	e := &c.ExtProc
	if !headerNameRe.MatchString(e.DestinationHeader) {
		v.errorf("extProc.destinationHeader", "%q is not a lower-case HTTP header name", e.DestinationHeader)
	}
	if e.MetadataNamespace == "" {
		v.errorf("extProc.metadataNamespace", "must not be empty")
	}
	if e.ServedHostKey == "" {
		v.errorf("extProc.servedHostKey", "must not be empty")
	}
	v.durRange("extProc.messageTimeout", e.MessageTimeout, time.Millisecond, time.Minute)
	v.durRange("extProc.maxRequestLifetime", e.MaxRequestLifetime, time.Second, 24*time.Hour)
	v.durRange("shutdown.drainTimeout", c.Shutdown.DrainTimeout, 0, 24*time.Hour)
	v.durRange("extProc.firstMessageTimeout", e.FirstMessageTimeout, time.Millisecond, 5*time.Minute)
	if t := e.GRPCClientTarget; t != "" && (strings.ContainsAny(t, " \t\n") || !strings.Contains(t, ":")) {
		v.errorf("extProc.grpcClientTarget", "%q: want a gRPC target URI such as dns:///tether:9002", t)
	}
	v.oneOf("extProc.bodyMode", e.BodyMode, BodyModeNone, BodyModeFullDuplex)
}

// newSessions checks the limits on new sessions.
func (v *validator) newSessions() {
	ns := &v.cfg.NewSessions
	v.durRange("newSessions.provisionalIdleTimeout", ns.ProvisionalIdleTimeout, 0, time.Hour)
	if ns.PerClientRate < 0 || ns.PerClientRate > 10000 {
		v.errorf("newSessions.perClientRate", "%g is out of range 0..10000", ns.PerClientRate)
	}
	v.intRange("newSessions.perClientBurst", ns.PerClientBurst, 1, 100000)
	v.intRange("newSessions.perClientMaxSessions", ns.PerClientMaxSessions, 0, 100000)
	if ns.PerServiceShare < 0 || ns.PerServiceShare > 1 {
		v.errorf("newSessions.perServiceShare", "%g is out of range 0..1", ns.PerServiceShare)
	}
	v.intRange("newSessions.wideBucketFactor", ns.WideBucketFactor, 1, 1000)
	v.prefixes("newSessions.trustedNetworks", ns.TrustedNetworks, "10.0.0.0/8")
}

// prefixes checks that each of list, at path, is a CIDR prefix; example is the error's.
func (v *validator) prefixes(path string, list []string, example string) {
	for i, n := range list {
		if _, err := netip.ParsePrefix(n); err != nil {
			v.errorf(fmt.Sprintf("%s[%d]", path, i), "%q is not a CIDR prefix (e.g. %s)", n, example)
		}
	}
}

func (v *validator) listeners() {
	l := v.cfg.Listeners
	used := map[string]string{} // normalized address → field that took it
	for _, f := range []struct{ path, addr string }{
		{"listeners.extProc", l.ExtProc},
		{"listeners.xds", l.XDS},
		{"listeners.api", l.API},
		{"listeners.sip", l.SIP},
	} {
		if f.addr == "" {
			continue
		}
		host, ok := v.hostPort(f.path, f.addr)
		if !ok {
			continue
		}
		_, port, _ := net.SplitHostPort(f.addr)
		if port == "0" {
			continue
		}
		key := net.JoinHostPort(host, port)
		if other, dup := used[key]; dup {
			v.errorf(f.path, "%s is already used by %s", f.addr, other)
			continue
		}
		used[key] = f.path
	}
}

// tls checks the TLS files and that no listener off loopback serves plain text unasked.
func (v *validator) tls() {
	c := v.cfg
	t := &c.TLS
	t.CertFile, t.KeyFile, t.ClientCAFile = v.resolve(t.CertFile), v.resolve(t.KeyFile), v.resolve(t.ClientCAFile)
	switch {
	case (t.CertFile == "") != (t.KeyFile == ""):
		v.errorf("tls", "set both certFile and keyFile, or neither")
	case t.ClientCAFile != "" && t.CertFile == "":
		v.errorf("tls.clientCAFile", "needs tls.certFile and tls.keyFile")
	}
	for _, f := range []struct{ path, file string }{
		{"tls.certFile", t.CertFile}, {"tls.keyFile", t.KeyFile}, {"tls.clientCAFile", t.ClientCAFile},
	} {
		if f.file == "" {
			continue
		}
		if _, err := os.Stat(f.file); err != nil {
			v.errorf(f.path, "cannot read: %v", err)
		}
	}
	if e := c.Envoy.TLS; (e.CertFile == "") != (e.KeyFile == "") {
		v.errorf("envoy.tls", "set both certFile and keyFile, or neither")
	}
	if t.Enabled() || c.Listeners.AllowInsecure {
		return
	}
	l := c.Listeners
	for _, f := range []struct{ path, addr string }{
		{"listeners.extProc", l.ExtProc}, {"listeners.xds", l.XDS}, {"listeners.api", l.API}, {"listeners.sip", l.SIP},
	} {
		if host, _, err := net.SplitHostPort(f.addr); err == nil && !isLoopback(host) {
			v.errorf(f.path, "%s is not a loopback address: configure tls (certFile, keyFile), or set listeners.allowInsecure: true to serve it in plain text", f.addr)
		}
	}
}

func (v *validator) auth(services map[string]int) {
	a := &v.cfg.Auth
	names := map[string]int{} // token and client names, one namespace
	for i := range a.Tokens {
		v.token(i, names, services)
	}
	for i := range a.Clients {
		c := &a.Clients[i]
		p := fmt.Sprintf("auth.clients[%d]", i)
		v.uniqueName(p+".name", c.Name, i, names, "duplicate name %q (also auth.tokens or auth.clients entry %d)")
		if c.ID == "" {
			v.errorf(p+".id", "required: the client certificate's URI SAN (e.g. spiffe://example.org/ops) or DNS SAN")
		}
		if v.cfg.TLS.ClientCAFile == "" {
			v.errorf(p, "client identities need tls.clientCAFile (mutual TLS) to verify certificates")
		}
		v.scope(p, c.Services, c.Access, services)
	}
	if a.AllowInsecure && !a.Enabled() {
		v.warnf("auth.allowInsecure", "set: the API may serve without authentication off loopback, where anyone who reaches it may read and change sessions and instances")
	}
	if v.cfg.Listeners.AllowInsecure && !v.cfg.TLS.Enabled() {
		v.warnf("listeners.allowInsecure", "set: listeners off loopback may serve plain text, which anyone on the path can read and forge")
	}
	if api := v.cfg.Listeners.API; api != "" && !a.Enabled() && !a.AllowInsecure {
		if host, _, err := net.SplitHostPort(api); err == nil && !isLoopback(host) {
			v.errorf("listeners.api", "%s is not a loopback address: configure auth.tokens, or set auth.allowInsecure: true to serve the API without authentication", api)
		}
	}
}

// token checks auth.tokens[i] and reads its tokenFile.
func (v *validator) token(i int, names, services map[string]int) {
	t := &v.cfg.Auth.Tokens[i]
	p := fmt.Sprintf("auth.tokens[%d]", i)
	v.uniqueName(p+".name", t.Name, i, names, "duplicate token name %q (also auth.tokens[%d])")
	switch {
	case t.Token != "" && t.TokenFile != "":
		v.errorf(p+".tokenFile", "set token or tokenFile, not both")
	case t.TokenFile != "":
		t.TokenFile = v.resolve(t.TokenFile)
		data, err := os.ReadFile(t.TokenFile)
		if err != nil {
			v.errorf(p+".tokenFile", "cannot read token: %v", err)
			break
		}
		t.Token = strings.TrimSpace(string(data))
		if t.Token == "" {
			v.errorf(p+".tokenFile", "%s is empty", t.TokenFile)
		}
	case t.Token != "":
	case v.set(p + ".token"):
		v.errorf(p+".token", "must not be empty")
	default:
		v.errorf(p, "set token or tokenFile")
	}
	v.scope(p, t.Services, t.Access, services)
}

// uniqueID checks the id at path, of entry i: set, valid (else invalid, with the id, says
// why) and not in seen yet (else dup, with the id and the other entry's index); a new one is
// added to seen.
func (v *validator) uniqueID(path, id string, i int, seen map[string]int, valid bool, invalid, dup string) {
	switch {
	case id == "":
		v.errorf(path, "required")
	case !valid:
		v.errorf(path, invalid, id)
	default:
		if j, ok := seen[id]; ok {
			v.errorf(path, dup, id, j)
		} else {
			seen[id] = i
		}
	}
}

// uniqueName checks that the name at path, of entry i, is set and not in names yet (dup, with
// the name and the other entry's index, says where it is), and adds it.
func (v *validator) uniqueName(path, name string, i int, names map[string]int, dup string) {
	if name == "" {
		v.errorf(path, "required")
		return
	}
	if j, seen := names[name]; seen {
		v.errorf(path, dup, name, j)
	}
	names[name] = i
}

// scope checks a token's or client identity's services and access.
func (v *validator) scope(p string, svcs []string, access string, services map[string]int) {
	if len(svcs) == 0 {
		v.errorf(p+".services", `required: list service names or "*"`)
	}
	for j, s := range svcs {
		if _, ok := services[s]; !ok && s != "*" {
			v.errorf(fmt.Sprintf("%s.services[%d]", p, j), "%q is not a configured service", s)
		}
	}
	v.oneOf(p+".access", access, AccessRead, AccessWrite)
}

// api checks the API listener's browser guard lists, connection cap and store bound.
func (v *validator) api() {
	a := &v.cfg.API
	v.intRange("api.maxConnections", a.MaxConnections, 0, 1000000)
	v.durRange("api.storeTimeout", a.StoreTimeout, 10*time.Millisecond, 30*time.Second)
	for i, h := range a.Hosts {
		if !listenerHostRe.MatchString(h) {
			v.errorf(fmt.Sprintf("api.hosts[%d]", i), "%q is not a host name (no port, no scheme)", h)
		}
	}
	for i, o := range a.Origins {
		u, err := url.Parse(o)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Path != "" || u.RawQuery != "" || u.User != nil {
			v.errorf(fmt.Sprintf("api.origins[%d]", i), "%q is not an origin: want scheme://host[:port] (http or https, no path)", o)
		}
	}
}

func (v *validator) service(i int, names map[string]int) {
	s := &v.cfg.Services[i]
	p := fmt.Sprintf("services[%d]", i)
	v.serviceName(s, p, i, names)
	for j, a := range s.Match.Authorities {
		if !authorityRe.MatchString(a) {
			v.errorf(fmt.Sprintf("%s.match.authorities[%d]", p, j), "%q is not a host name (no scheme, no port)", a)
		}
	}
	v.slashPath(p+".match.pathPrefix", s.Match.PathPrefix)
	v.oneOf(p+".affinity", string(s.Affinity), affinity.Affinities()...)
	v.balancing(s, p)
	v.intRange(p+".sessionsPerInstance", s.SessionsPerInstance, 1, 200)
	v.intRange(p+".requestSlotsPerInstance", s.RequestSlotsPerInstance, 1, 10000)
	v.lifetimes(s, p)
	v.cookie(s, p)
	v.sse(s, p)
	v.dcrFile(s, p)
	if f := s.HashBalanceFactor; f != 0 && f < 1 {
		v.errorf(p+".hashBalanceFactor", "%g must be 0 (off) or at least 1", f)
	}
	v.calls(s, p)
	v.intRange(p+".streamsPerInstance", s.StreamsPerInstance, 0, 10000)
	v.mcpHandle(s, p)
	v.oneOf(p+".upstream.protocol", s.Upstream.Protocol, ProtocolHTTP1, ProtocolHTTP2)
	if s.BodyMode != "" {
		v.oneOf(p+".bodyMode", s.BodyMode, BodyModeNone, BodyModeFullDuplex)
	}
	v.durRange(p+".upstream.connectTimeout", s.Upstream.ConnectTimeout, time.Millisecond, time.Minute)
	v.healthCheck(s, p)
	v.serviceDiscovery(p, &s.Discovery)
	ids := map[string]int{}
	endpoints := map[string]string{}
	for j := range s.Instances {
		v.instance(s, fmt.Sprintf("%s.instances[%d]", p, j), j, ids, endpoints)
	}
	v.protocolWarnings(s, p+".instances")
}

// serviceName checks the name of service s (services[i], at p) and adds it to names.
func (v *validator) serviceName(s *Service, p string, i int, names map[string]int) {
	v.uniqueID(p+".name", s.Name, i, names, len(s.Name) <= 63 && serviceNameRe.MatchString(s.Name),
		"%q must be at most 63 lower-case letters, digits and -, starting and ending with a letter or digit",
		"duplicate service name %q (also services[%d])")
}

// balancing checks a service's balancing against its affinity and sets the default.
func (v *validator) balancing(s *Service, p string) {
	switch {
	case s.Balancing == "" && s.Affinity == registry.AffinityHash:
		s.Balancing = registry.BalanceConsistentHash
	case s.Balancing == "":
		s.Balancing = registry.BalanceRoundRobin
	default:
		v.oneOf(p+".balancing", string(s.Balancing), string(registry.BalanceRoundRobin), string(registry.BalanceStickyRoundRobin),
			string(registry.BalanceLeastRequest), string(registry.BalanceConsistentHash))
		if s.Affinity == registry.AffinityHash && s.Balancing != registry.BalanceConsistentHash {
			v.errorf(p+".balancing", "affinity hash needs balancing consistent-hash, not %s", s.Balancing)
		}
	}
}

// lifetimes checks a service's session lifetimes and derives the idle timeout's default.
func (v *validator) lifetimes(s *Service, p string) {
	v.durRange(p+".sessionTTL", s.SessionTTL, time.Second, 6*time.Hour)
	if !v.set(p+".idleTimeout") && s.IdleTimeout > s.SessionTTL {
		s.IdleTimeout = s.SessionTTL // the default never exceeds an explicitly shorter TTL
	}
	v.durRange(p+".idleTimeout", s.IdleTimeout, 0, 6*time.Hour)
	if s.IdleTimeout > s.SessionTTL && !v.errs.has(p+".sessionTTL") {
		v.errorf(p+".idleTimeout", "%s is longer than sessionTTL %s", fmtDuration(s.IdleTimeout), fmtDuration(s.SessionTTL))
	}
	v.durRange(p+".maxLifetime", s.MaxLifetime, 0, 24*time.Hour)
	if s.MaxLifetime == 0 && v.cfg.Shutdown.Handoff && v.cfg.Store.Backend == StoreRedis {
		v.warnf(p+".maxLifetime", "0 (unbounded) with store.backend redis and shutdown.handoff: this service's exchanges are never handed off at a drain (a handed-off exchange's request slot stays leased until its maxLifetime, which has no end here); they are kept up to shutdown.drainTimeout and then reset")
	}
}

// cookie checks a service's cookie, upstream cookie and header field.
func (v *validator) cookie(s *Service, p string) {
	if !cookieNameRe.MatchString(s.Cookie.Name) {
		v.errorf(p+".cookie.name", "%q is not a valid cookie name", s.Cookie.Name)
	}
	v.slashPath(p+".cookie.path", s.Cookie.Path)
	v.oneOf(p+".cookie.sameSite", s.Cookie.SameSite, "Lax", "Strict", "None", "")
	v.oneOf(p+".cookie.lifetime", s.Cookie.Lifetime, CookiePermanent, CookieSession)
	if s.Cookie.SameSite == "None" && !s.Cookie.Secure {
		v.errorf(p+".cookie.sameSite", "None needs cookie.secure: true (browsers drop SameSite=None cookies without Secure)")
	}
	if u := s.Sticky.UpstreamCookie; u != "" && !cookieNameRe.MatchString(u) {
		v.errorf(p+".sticky.upstreamCookie", "%q is not a valid cookie name", u)
	}
	if !headerFieldRe.MatchString(s.HeaderField) {
		v.errorf(p+".headerField", "%q must be 5..40 characters: a letter, then letters, digits, - or _", s.HeaderField)
	}
}

// sse checks a service's MCP SSE settings.
func (v *validator) sse(s *Service, p string) {
	v.slashPath(p+".sse.path", s.SSE.Path)
	if s.Affinity == registry.AffinityMCPSSE && strings.HasPrefix(s.SSE.Path, "/") && !strings.HasPrefix(s.SSE.Path, s.Match.PathPrefix) {
		v.errorf(p+".sse.path", "%s is outside match.pathPrefix %s, so SSE requests would not reach this service", s.SSE.Path, s.Match.PathPrefix)
	}
	v.oneOf(p+".sse.sessionParam", s.SSE.SessionParam, "sessionId", "session_id", "sessionid")
}

// dcrFile resolves a service's DCR rules file and checks that it can be read.
func (v *validator) dcrFile(s *Service, p string) {
	if s.DCRFile != "" {
		s.DCRFile = v.resolve(s.DCRFile)
		if fi, err := os.Stat(s.DCRFile); err != nil {
			v.errorf(p+".dcrFile", "cannot read rules: %v", err)
		} else if fi.IsDir() {
			v.errorf(p+".dcrFile", "%s is a directory", s.DCRFile)
		}
	}
}

// healthCheck checks a service's health check and derives the timeout's default.
func (v *validator) healthCheck(s *Service, p string) {
	hc := &s.HealthCheck
	v.slashPath(p+".healthCheck.path", hc.Path)
	if hc.Interval != 0 {
		v.durRange(p+".healthCheck.interval", hc.Interval, 10*time.Millisecond, time.Hour)
		if !v.set(p+".healthCheck.timeout") && hc.Timeout > hc.Interval {
			hc.Timeout = hc.Interval // the default never exceeds an explicitly shorter interval
		}
	}
	v.durRange(p+".healthCheck.timeout", hc.Timeout, time.Millisecond, time.Minute)
	if hc.Interval > 0 && hc.Timeout > hc.Interval && !v.errs.has(p+".healthCheck.interval") {
		v.errorf(p+".healthCheck.timeout", "%s is longer than healthCheck.interval %s", fmtDuration(hc.Timeout), fmtDuration(hc.Interval))
	}
	v.intRange(p+".healthCheck.healthyThreshold", hc.HealthyThreshold, 1, 100)
	v.intRange(p+".healthCheck.unhealthyThreshold", hc.UnhealthyThreshold, 1, 100)
}

func (v *validator) instance(s *Service, p string, j int, ids map[string]int, endpoints map[string]string) {
	in := &s.Instances[j]
	v.uniqueID(p+".id", in.ID, j, ids, len(in.ID) <= 63 && instanceIDRe.MatchString(in.ID),
		"%q must be at most 63 letters, digits, -, . and _, starting and ending with a letter or digit",
		"duplicate instance id %q (also instances[%d])")
	addrOK := v.instanceAddress(in, p)
	v.intRange(p+".ports.http", in.Ports.HTTP, 0, 65535)
	v.intRange(p+".ports.sip", in.Ports.SIP, 0, 65535)
	rs := registry.Service{Affinity: s.Affinity, Balancing: s.Balancing}
	switch {
	case in.Ports.HTTP == 0 && in.Ports.SIP == 0:
		v.errorf(p+".ports", "set ports.http, ports.sip or both")
	case in.Ports.HTTP == 0 && !affinity.Serves(rs, affinity.ProtocolSIP):
		v.errorf(p+".ports.http", "required: affinity %s routes HTTP requests", affinity.ModeName(rs))
	case in.Ports.SIP != 0 && !affinity.Serves(rs, affinity.ProtocolSIP):
		v.errorf(p+".ports.sip", "affinity %s does not serve SIP (only none and hash do): a SIP decision for this service is refused", affinity.ModeName(rs))
	}
	if addrOK {
		v.instanceEndpoints(in, p, fmt.Sprintf("instances[%d] (%s)", j, in.ID), endpoints)
	}
	v.intRange(p+".weight", in.Weight, 1, 1000)
	v.oneOf(p+".state", string(in.State), string(registry.StateActive), string(registry.StateStandby), string(registry.StateDraining))
}

// instanceAddress checks an instance's address against the address policy and writes it in
// canonical form; it reports whether the address is usable.
func (v *validator) instanceAddress(in *Instance, p string) bool {
	a, err := netip.ParseAddr(unbracket(in.Address))
	switch {
	case in.Address == "":
		v.errorf(p+".address", "required")
	case err != nil:
		v.errorf(p+".address", "%q is not an IP address (host names are not resolved)", in.Address)
	case a.Zone() != "":
		v.errorf(p+".address", "%q: IPv6 zones are not supported", in.Address)
	case a.IsUnspecified():
		v.errorf(p+".address", "%s is the unspecified address, not an instance's address", in.Address)
	default:
		// Envoy's override_host finds a host by the exact string of its canonical ip:port
		// (inet_ntop for IPv6: lower case, zeros compressed), so an address written as
		// 2001:DB8:0::1 or [::1] would never match and Envoy's fallback would pick silently.
		in.Address = a.String()
		if err := v.policy.CheckAddr(a); err != nil {
			v.errorf(p+".address", "%s", refusedReason(err))
			return false
		}
		return true
	}
	return false
}

// instanceEndpoints checks each of an instance's ports against the address policy and that
// no other instance (endpoints: each endpoint's owner so far) has the same endpoint; owner
// names this one.
func (v *validator) instanceEndpoints(in *Instance, p, owner string, endpoints map[string]string) {
	for _, e := range []struct {
		field string
		port  int
	}{{"ports.http", in.Ports.HTTP}, {"ports.sip", in.Ports.SIP}} {
		if e.port <= 0 || e.port > 65535 {
			continue
		}
		if err := v.policy.CheckInstance(registry.Instance{Address: in.Address, HTTPPort: e.port}); err != nil {
			v.errorf(p+"."+e.field, "%s", refusedReason(err))
			continue
		}
		key := e.field + " " + net.JoinHostPort(in.Address, strconv.Itoa(e.port))
		if other, dup := endpoints[key]; dup {
			v.errorf(p+"."+e.field, "%s is already used by %s", net.JoinHostPort(in.Address, strconv.Itoa(e.port)), other)
			continue
		}
		endpoints[key] = owner
	}
}

// refusedReason is an AddressPolicy error without its sentinel's text.
func refusedReason(err error) string {
	return strings.TrimSuffix(err.Error(), ": "+registry.ErrRefusedAddress.Error())
}

// mcpHandle checks a service's handle-affinity settings.
func (v *validator) mcpHandle(s *Service, p string) {
	h := s.MCPHandle
	if h.Header == "" {
		return
	}
	p += ".mcpHandle"
	if s.Affinity != registry.AffinityMCPStreamable {
		v.errorf(p+".header", "handle affinity is for mcp-streamable services (affinity %s)", s.Affinity)
	}
	if !headerToken.MatchString(h.Header) || len(h.Header) > 64 {
		v.errorf(p+".header", "%q is not an x-mcp-header name (letters, digits and -, at most 64)", h.Header)
	}
	if h.LearnHeader != "" && !headerToken.MatchString(h.LearnHeader) {
		v.errorf(p+".learnHeader", "%q is not a header name", h.LearnHeader)
	}
	if h.LearnHeader == "" && !h.InstancePrefix {
		v.errorf(p+".learnHeader", "a handle is bound from learnHeader or from its instance prefix: set learnHeader or instancePrefix: true")
	}
	if h.InstancePrefix && !validPrefixSeparator(h.PrefixSeparator) {
		v.errorf(p+".prefixSeparator", "%q must be one visible character that instance ids cannot contain (not a letter, digit, '-', '.' or '_')", h.PrefixSeparator)
	}
	if h.InstancePrefix && h.LearnHeader == "" && v.cfg.Store.Backend == StoreRedis {
		v.warnf(p+".instancePrefix", "without learnHeader a prefix handle binds only on the replica that saw its mint (mint credits are per replica): set learnHeader for replicas sharing Redis")
	}
}

// headerToken matches a header name as tether accepts one in config.
var headerToken = regexp.MustCompile(`^[A-Za-z0-9][-A-Za-z0-9]*$`)

// validPrefixSeparator reports whether sep is one visible ASCII character that instance ids
// cannot contain.
func validPrefixSeparator(sep string) bool {
	if len(sep) != 1 || strings.ContainsAny(sep, "-._") {
		return false
	}
	c := sep[0]
	return c >= 0x21 && c <= 0x7e && (c < '0' || c > '9') && !unicodeLetter(c)
}

func unicodeLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

// calls checks a service's call-load settings.
func (v *validator) calls(s *Service, p string) {
	c := s.Calls
	if c.Track && !affinity.Serves(registry.Service{Affinity: s.Affinity, Balancing: s.Balancing}, affinity.ProtocolSIP) {
		v.errorf(p+".calls.track", "affinity %s does not serve SIP (only none and hash do): it has no calls to count",
			affinity.ModeName(registry.Service{Affinity: s.Affinity, Balancing: s.Balancing}))
	}
	v.intRange(p+".calls.capPerInstance", c.CapPerInstance, 0, 1_000_000)
	v.intRange(p+".calls.perSourceSetup", c.PerSourceSetup, 0, 1_000_000)
	if c.CapPerInstance > 0 && !c.Track {
		v.errorf(p+".calls.capPerInstance", "needs calls.track: true (calls are counted only when tracked)")
	}
	v.durRange(p+".calls.ttl", c.TTL, time.Second, 48*time.Hour)
	v.durRange(p+".calls.setupTTL", c.SetupTTL, time.Second, time.Hour)
}

// protocolWarnings warns where a service that serves both protocols cannot serve one of them
// with every instance: instances without the protocol's port are never chosen for it.
func (v *validator) protocolWarnings(s *Service, p string) {
	if len(s.Instances) == 0 || !affinity.Serves(registry.Service{Affinity: s.Affinity, Balancing: s.Balancing}, affinity.ProtocolSIP) {
		return
	}
	var http, sip int
	for _, in := range s.Instances {
		if in.Ports.HTTP > 0 {
			http++
		}
		if in.Ports.SIP > 0 {
			sip++
		}
	}
	n := len(s.Instances)
	switch {
	case http == 0:
		v.warnf(p, "no instance has ports.http: HTTP requests matching service %s are refused (503)", s.Name)
	case http < n:
		v.warnf(p, "%d of %d instances have ports.http: HTTP requests go to those only", http, n)
	}
	if sip > 0 && sip < n {
		v.warnf(p, "%d of %d instances have ports.sip: SIP decisions go to those only", sip, n)
	}
}

// matches rejects two services that would answer exactly the same requests: the same path
// prefix and overlapping authorities (an empty list overlaps only another empty list).
func (v *validator) matches() {
	svcs := v.cfg.Services
	for i := range svcs {
		for j := range i {
			a, b := svcs[i].Match, svcs[j].Match
			if a.PathPrefix != b.PathPrefix {
				continue
			}
			same := len(a.Authorities) == 0 && len(b.Authorities) == 0
			for _, h := range a.Authorities {
				if slices.ContainsFunc(b.Authorities, func(o string) bool { return strings.EqualFold(o, h) }) {
					same = true
				}
			}
			if same {
				v.errorf(fmt.Sprintf("services[%d].match", i), "same match as services[%d] (%s): requests could go to either", j, svcs[j].Name)
				break
			}
		}
	}
}

// unbracket strips the brackets of an IPv6 literal written as in a URL ("[::1]").
func unbracket(addr string) string {
	if len(addr) > 2 && addr[0] == '[' && addr[len(addr)-1] == ']' {
		return addr[1 : len(addr)-1]
	}
	return addr
}

// replicas checks envoy.replicas and envoy.replicaMode: every address one Envoy can dial (a
// host and a port), each listed once.
func (v *validator) replicas() {
	e := v.cfg.Envoy
	switch e.ReplicaMode {
	case ReplicasActiveActive:
	case ReplicasActiveStandby:
		if len(e.Replicas) < 2 {
			v.errorf("envoy.replicaMode", "%s needs at least two envoy.replicas", e.ReplicaMode)
		}
	default:
		v.errorf("envoy.replicaMode", "%q must be %s or %s", e.ReplicaMode, ReplicasActiveActive, ReplicasActiveStandby)
	}
	seen := map[string]string{}
	for i, r := range e.Replicas {
		for field, addr := range map[string]string{"xds": r.XDS, "extProc": r.ExtProc} {
			p := fmt.Sprintf("envoy.replicas[%d].%s", i, field)
			if addr == "" {
				v.errorf(p, "required")
				continue
			}
			host, ok := v.hostPort(p, addr)
			if !ok {
				continue
			}
			_, port, _ := net.SplitHostPort(addr)
			if ip, err := netip.ParseAddr(host); host == "" || port == "0" || err == nil && ip.IsUnspecified() {
				v.errorf(p, "%q is not an address Envoy can dial: name the replica's host and port", addr)
				continue
			}
			key := addr
			if ip, err := netip.ParseAddr(host); err == nil {
				key = net.JoinHostPort(ip.String(), port)
			}
			if other, dup := seen[key]; dup {
				v.errorf(p, "%s is already listed as %s", key, other)
				continue
			}
			seen[key] = p
		}
	}
}

// ackDurability checks store.redis.ackDurability and its WAIT settings.
func (v *validator) ackDurability(r *RedisStore) {
	modes := make([]string, len(redisstore.AckDurabilities))
	for i, m := range redisstore.AckDurabilities {
		modes[i] = string(m)
	}
	v.oneOf("store.redis.ackDurability", r.AckDurability, modes...)
	v.intRange("store.redis.ackReplicas", r.AckReplicas, 1, 64)
	call := quota.CallTimeout(v.cfg.ExtProc.MessageTimeout)
	if r.AckTimeout < time.Millisecond {
		v.errorf("store.redis.ackTimeout", "%s is shorter than 1ms (WAIT 0 would wait forever)", fmtDuration(r.AckTimeout))
	} else if r.AckTimeout >= call && r.AckDurability != string(redisstore.AckNone) {
		v.errorf("store.redis.ackTimeout", "%s is not shorter than the store's call timeout on a request's path (extProc.messageTimeout / 4 = %s), inside which a new session waits for its acknowledgement: lower it, or raise extProc.messageTimeout",
			fmtDuration(r.AckTimeout), fmtDuration(call))
	}
}

// storeRedis checks the redis backend's settings.
func (v *validator) storeRedis() {
	c := v.cfg
	v.oneOf("store.backend", c.Store.Backend, StoreMemory, StoreRedis)
	if c.Store.Backend != StoreRedis {
		return
	}
	r := &c.Store.Redis
	if len(r.Addresses) == 0 {
		v.errorf("store.redis.addresses", "required with store.backend: redis (host:port of the server, Cluster seeds or Sentinels)")
	}
	for i, a := range r.Addresses {
		if _, _, err := net.SplitHostPort(a); err != nil {
			v.errorf(fmt.Sprintf("store.redis.addresses[%d]", i), "%q is not host:port", a)
		}
	}
	if c.Store.SnapshotPath != "" {
		v.errorf("store.snapshotPath", "snapshots are for the memory backend; with redis, persistence is Redis's (appendonly)")
	}
	v.intRange("store.redis.db", r.DB, 0, 15)
	if strings.ContainsAny(r.KeyPrefix, "{}") {
		v.errorf("store.redis.keyPrefix", "must not contain '{' or '}' (they delimit Cluster hash tags)")
	}
	v.durRange("store.redis.touchDelay", r.TouchDelay, 10*time.Millisecond, 10*time.Second)
	v.durRange("store.redis.leaseTTL", r.LeaseTTL, time.Second, 5*time.Minute)
	v.durRange("store.redis.degradedFor", r.DegradedFor, time.Second, 5*time.Minute)
	v.durRange("store.redis.healthLeaseTTL", r.HealthLeaseTTL, time.Second, 5*time.Minute)
	v.durRange("store.redis.registryResync", r.RegistryResync, 100*time.Millisecond, 5*time.Minute)
	v.ackDurability(r)
	v.redisPassword(r)
	v.redisTLS(&r.TLS)
}

// redisPassword checks store.redis's password settings and reads passwordFile (resolved
// against the config's folder) into Password.
func (v *validator) redisPassword(r *RedisStore) {
	if r.Password != "" && r.PasswordFile != "" {
		v.errorf("store.redis.passwordFile", "set password or passwordFile, not both")
	}
	if r.PasswordFile != "" {
		r.PasswordFile = v.resolve(r.PasswordFile)
		b, err := os.ReadFile(r.PasswordFile)
		if err != nil {
			v.errorf("store.redis.passwordFile", "cannot read: %v", err)
		} else {
			r.Password = strings.TrimSpace(string(b))
		}
	}
}

// redisTLS checks store.redis.tls, resolving its files against the config's folder: a
// certificate goes with its key, and a file is set only with TLS enabled and readable.
func (v *validator) redisTLS(t *RedisTLS) {
	t.CAFile, t.CertFile, t.KeyFile = v.resolve(t.CAFile), v.resolve(t.CertFile), v.resolve(t.KeyFile)
	if (t.CertFile == "") != (t.KeyFile == "") {
		v.errorf("store.redis.tls", "set both certFile and keyFile, or neither")
	}
	for _, f := range []struct{ path, file string }{
		{"store.redis.tls.caFile", t.CAFile}, {"store.redis.tls.certFile", t.CertFile}, {"store.redis.tls.keyFile", t.KeyFile},
	} {
		if f.file == "" {
			continue
		}
		if !t.Enabled {
			v.errorf(f.path, "set store.redis.tls.enabled: true to use it")
		}
		if _, err := os.Stat(f.file); err != nil {
			v.errorf(f.path, "cannot read: %v", err)
		}
	}
}
