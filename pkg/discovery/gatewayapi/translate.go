package gatewayapi

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/tether-dev/tether/pkg/discovery/kubernetes"
	"github.com/tether-dev/tether/pkg/registry"
)

// Limits tether puts on what a route asks for (the config file's ranges, see package config).
const (
	MinSessionTTL = time.Second
	MaxSessionTTL = 6 * time.Hour
)

// World is what the source has observed: the routes and what they refer to. Translate reads it
// only.
type World struct {
	// Routes are the HTTPRoutes in the watched namespaces, as the API server returned them
	// (JSON of the whole object: fields the typed struct lacks, such as the newer
	// sessionPersistence union or the older idleTimeout, are read from it).
	Routes []Route
	// GatewayClass maps a Gateway "namespace/name" to its spec.gatewayClassName.
	GatewayClass map[string]string
	// Services maps "namespace/name" to the core Service.
	Services map[string]*corev1.Service
	// Slices maps a Service "namespace/name" to its EndpointSlices.
	Slices map[string][]*discoveryv1.EndpointSlice
}

// Route is one HTTPRoute: its typed form and its JSON.
type Route struct {
	Typed *gwv1.HTTPRoute
	JSON  []byte
}

// Result is what Translate makes of a World.
type Result struct {
	Services  []registry.Service  // sorted by name
	Instances []registry.Instance // sorted by service, id
	// Status is, per route "namespace/name", the parent statuses tether owns (controllerName
	// = the source's), in parentRef order; a route tether has nothing to say about (not
	// selected, or no rule with sessionPersistence) maps to nil, so stale entries are removed.
	Status map[string][]gwv1.RouteParentStatus
}

// rawRoute reads the parts of an HTTPRoute whose fields differ between Gateway API versions.
type rawRoute struct {
	Spec struct {
		Rules []struct {
			SessionPersistence *rawPersistence `json:"sessionPersistence"`
		} `json:"rules"`
	} `json:"spec"`
}

// rawPersistence holds both shapes of GEP-1619 session persistence: v1.x (sessionName,
// cookieConfig.lifetimeType, idleTimeout until v1.6) and the union after v1.6 (cookie{name,
// path, lifetimeType}, header{name}).
type rawPersistence struct {
	SessionName     *string `json:"sessionName"`
	AbsoluteTimeout *string `json:"absoluteTimeout"`
	IdleTimeout     *string `json:"idleTimeout"`
	Type            *string `json:"type"`
	CookieConfig    *struct {
		LifetimeType *string `json:"lifetimeType"`
	} `json:"cookieConfig"`
	Cookie *struct {
		Name         *string `json:"name"`
		Path         *string `json:"path"`
		LifetimeType *string `json:"lifetimeType"`
	} `json:"cookie"`
	Header *struct {
		Name *string `json:"name"`
	} `json:"header"`
}

var (
	// gatewayDurationRe is the Gateway API's Duration format (GEP-2257).
	gatewayDurationRe = regexp.MustCompile(`^([0-9]{1,5}(h|m|s|ms)){1,4}$`)
	cookieNameRe      = regexp.MustCompile("^[!#$%&'*+\\-.^_`|~0-9A-Za-z]+$")
	headerFieldRe     = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]{4,39}$`)
	serviceNameRe     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
)

// refusal is why tether cannot honour (part of) a route, as a Gateway API condition reason.
type refusal struct {
	cond   gwv1.RouteConditionType
	reason gwv1.RouteConditionReason
	msg    string
}

// Translate maps w to tether services, instances and route statuses under cfg. It is pure:
// same input, same output.
func Translate(cfg Config, w World) Result {
	res := Result{Status: map[string][]gwv1.RouteParentStatus{}}
	var sel labels.Selector
	if cfg.RouteSelector != "" {
		sel, _ = labels.Parse(cfg.RouteSelector) // checked by New
	}
	for _, r := range w.Routes {
		rt := r.Typed
		key := rt.Namespace + "/" + rt.Name
		parents, selected := ourParents(cfg, w, rt, sel)
		if !selected {
			res.Status[key] = nil
			continue
		}
		var raw rawRoute
		_ = json.Unmarshal(r.JSON, &raw) // the same bytes decoded into Typed
		var accepted, rejected []string
		var refused, unresolved []refusal
		for i, rule := range rt.Spec.Rules {
			var p *rawPersistence
			if i < len(raw.Spec.Rules) {
				p = raw.Spec.Rules[i].SessionPersistence
			}
			if p == nil {
				continue
			}
			label := ruleLabel(i, rule)
			name := serviceName(rt.Namespace, rt.Name, i, rule)
			svc, bad := service(cfg, rt, rule, p, name)
			if bad != nil {
				rejected = append(rejected, label)
				bad.msg = label + ": " + bad.msg
				refused = append(refused, *bad)
				continue
			}
			ins, probs := backends(w, rt, rule, name)
			for _, pr := range probs {
				pr.msg = label + ": " + pr.msg
				unresolved = append(unresolved, pr)
			}
			accepted = append(accepted, label)
			res.Services = append(res.Services, svc)
			res.Instances = append(res.Instances, ins...)
		}
		if len(accepted) == 0 && len(rejected) == 0 {
			res.Status[key] = nil // no rule asks for persistence: not tether's business
			continue
		}
		conds := conditions(rt.Generation, accepted, refused, unresolved)
		var st []gwv1.RouteParentStatus
		for _, p := range parents {
			st = append(st, gwv1.RouteParentStatus{
				ParentRef:      p,
				ControllerName: gwv1.GatewayController(cfg.ControllerName),
				Conditions:     slices.Clone(conds),
			})
		}
		res.Status[key] = st
	}
	slices.SortFunc(res.Services, func(a, b registry.Service) int { return cmp.Compare(a.Name, b.Name) })
	slices.SortFunc(res.Instances, func(a, b registry.Instance) int {
		return cmp.Or(cmp.Compare(a.Service, b.Service), cmp.Compare(a.ID, b.ID))
	})
	return res
}

// ourParents returns the route's parentRefs tether reports under and whether tether serves the
// route: with gatewayClasses, the parentRefs naming a Gateway of one of those classes; with a
// routeSelector, every parentRef of a route whose labels match. Either suffices.
func ourParents(cfg Config, w World, rt *gwv1.HTTPRoute, sel labels.Selector) ([]gwv1.ParentReference, bool) {
	bySelector := sel != nil && sel.Matches(labels.Set(rt.Labels))
	var out []gwv1.ParentReference
	for _, p := range rt.Spec.ParentRefs {
		if bySelector {
			out = append(out, p)
			continue
		}
		if p.Group != nil && *p.Group != gwv1.GroupName || p.Kind != nil && *p.Kind != "Gateway" {
			continue
		}
		ns := rt.Namespace
		if p.Namespace != nil {
			ns = string(*p.Namespace)
		}
		if class, ok := w.GatewayClass[ns+"/"+string(p.Name)]; ok && slices.Contains(cfg.GatewayClasses, class) {
			out = append(out, p)
		}
	}
	return out, bySelector || len(out) > 0
}

func ruleLabel(i int, rule gwv1.HTTPRouteRule) string {
	if rule.Name != nil && *rule.Name != "" {
		return fmt.Sprintf("rule %d (%s)", i, *rule.Name)
	}
	return fmt.Sprintf("rule %d", i)
}

// ServiceName is the tether service of rule i of route namespace/name: "<namespace>-<route>-
// <rule name, or r<i>>", lower-cased; a name longer than 63 characters (or not a DNS label)
// is cut to 54 and suffixed with "-" and 8 hex digits of its SHA-256, so it stays unique.
func serviceName(ns, route string, i int, rule gwv1.HTTPRouteRule) string {
	part := "r" + strconv.Itoa(i)
	if rule.Name != nil && *rule.Name != "" {
		part = string(*rule.Name)
	}
	n := strings.ToLower(ns + "-" + route + "-" + part)
	if len(n) <= 63 && serviceNameRe.MatchString(n) {
		return n
	}
	sum := sha256.Sum256([]byte(n))
	clean := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		return '-'
	}, n)
	clean = strings.Trim(clean[:min(len(clean), 54)], "-")
	return clean + "-" + hex.EncodeToString(sum[:4])
}

// service builds the tether service of one rule, or says what tether cannot honour.
func service(cfg Config, rt *gwv1.HTTPRoute, rule gwv1.HTTPRouteRule, p *rawPersistence, name string) (registry.Service, *refusal) {
	svc, err := ruleService(cfg, rt, rule, p, name)
	if err != nil {
		return registry.Service{}, &refusal{cond: gwv1.RouteConditionAccepted, reason: gwv1.RouteReasonUnsupportedValue, msg: err.Error()}
	}
	return svc, nil
}

// ruleService is service's work; its error is what tether cannot honour.
func ruleService(cfg Config, rt *gwv1.HTTPRoute, rule gwv1.HTTPRouteRule, p *rawPersistence, name string) (registry.Service, error) {
	prefix, err := pathPrefix(rule)
	if err != nil {
		return registry.Service{}, err
	}
	typ := "Cookie"
	if p.Type != nil {
		typ = *p.Type
	}
	mode := registry.AffinityCookie
	switch typ {
	case "Cookie":
	case "Header":
		mode = registry.AffinityHeader
	default:
		return registry.Service{}, fmt.Errorf("sessionPersistence.type %q is not supported (Cookie or Header)", typ)
	}
	svc := cfg.Defaults(name, mode)
	svc.Match = registry.Match{PathPrefix: prefix}
	for _, h := range rt.Spec.Hostnames {
		svc.Match.Authorities = append(svc.Match.Authorities, string(h))
	}
	if err := timeouts(&svc, rt, p); err != nil {
		return registry.Service{}, err
	}
	n, err := namingOf(typ, p)
	if err != nil {
		return registry.Service{}, err
	}
	switch mode {
	case registry.AffinityCookie:
		err = n.cookie(&svc, prefix, p)
	case registry.AffinityHeader:
		err = n.header(&svc)
	}
	if err != nil {
		return registry.Service{}, err
	}
	return svc, nil
}

// timeouts sets the service's session TTL and idle timeout from the persistence and the
// route's idle-timeout annotation.
func timeouts(svc *registry.Service, rt *gwv1.HTTPRoute, p *rawPersistence) error {
	if p.AbsoluteTimeout != nil {
		d, err := gatewayDuration(*p.AbsoluteTimeout)
		if err != nil {
			return fmt.Errorf("sessionPersistence.absoluteTimeout: %w", err)
		}
		if d < MinSessionTTL || d > MaxSessionTTL {
			return fmt.Errorf("sessionPersistence.absoluteTimeout %s is out of tether's range %s..%s", *p.AbsoluteTimeout, MinSessionTTL, MaxSessionTTL)
		}
		svc.SessionTTL = d
	}
	idleSet := false
	if p.IdleTimeout != nil { // Gateway API before v1.6
		d, err := gatewayDuration(*p.IdleTimeout)
		if err != nil {
			return fmt.Errorf("sessionPersistence.idleTimeout: %w", err)
		}
		svc.IdleTimeout, idleSet = d, true
	}
	if v, ok := rt.Annotations[AnnotationIdleTimeout]; ok {
		d, err := gatewayDuration(v)
		if err != nil && v != "0" && v != "0s" {
			return fmt.Errorf("annotation %s: %w", AnnotationIdleTimeout, err)
		}
		svc.IdleTimeout, idleSet = d, true
	}
	switch {
	case !idleSet && svc.IdleTimeout > svc.SessionTTL:
		svc.IdleTimeout = svc.SessionTTL // the default never exceeds a shorter absoluteTimeout
	case svc.IdleTimeout > svc.SessionTTL:
		return fmt.Errorf("idle timeout %s is longer than the session's absolute timeout %s", svc.IdleTimeout, svc.SessionTTL)
	}
	return nil
}

// naming is what a persistence says of the session's name: the name, the cookie's lifetime
// type and its path.
type naming struct {
	name     *string
	lifetime string
	path     *string
}

// namingOf reads the naming of a persistence of type typ; the cookie and header blocks must
// match the type.
func namingOf(typ string, p *rawPersistence) (naming, error) {
	n := naming{name: p.SessionName}
	if p.CookieConfig != nil && p.CookieConfig.LifetimeType != nil {
		n.lifetime = *p.CookieConfig.LifetimeType
	}
	if p.Cookie != nil {
		if typ != "Cookie" {
			return naming{}, fmt.Errorf("sessionPersistence.cookie is set with type %s", typ)
		}
		if p.Cookie.Name != nil {
			n.name = p.Cookie.Name
		}
		if p.Cookie.LifetimeType != nil {
			n.lifetime = *p.Cookie.LifetimeType
		}
		n.path = p.Cookie.Path
	}
	if p.Header != nil {
		if typ != "Header" {
			return naming{}, fmt.Errorf("sessionPersistence.header is set with type %s", typ)
		}
		if p.Header.Name != nil {
			n.name = p.Header.Name
		}
	}
	return n, nil
}

// cookie sets a cookie-affinity service's cookie (its path defaults to the rule's prefix).
func (n naming) cookie(svc *registry.Service, prefix string, p *rawPersistence) error {
	if n.name != nil && *n.name != "" {
		if !cookieNameRe.MatchString(*n.name) {
			return fmt.Errorf("session name %q is not a cookie name", *n.name)
		}
		svc.Cookie.Name = *n.name
	}
	svc.Cookie.Path = prefix
	if n.path != nil && *n.path != "" {
		if !strings.HasPrefix(*n.path, "/") {
			return fmt.Errorf("cookie path %q does not start with /", *n.path)
		}
		svc.Cookie.Path = *n.path
	}
	switch n.lifetime {
	case "", "Session": // the Gateway API default
		svc.Cookie.SessionLifetime = true
	case "Permanent":
		if p.AbsoluteTimeout == nil {
			return errors.New("a Permanent cookie needs absoluteTimeout (its Max-Age)")
		}
		svc.Cookie.SessionLifetime = false
	default:
		return fmt.Errorf("cookie lifetimeType %q is not supported (Session or Permanent)", n.lifetime)
	}
	return nil
}

// header sets a header-affinity service's header field.
func (n naming) header(svc *registry.Service) error {
	if n.lifetime != "" {
		return errors.New("cookieConfig is set with type Header")
	}
	if n.name != nil && *n.name != "" {
		if !headerFieldRe.MatchString(*n.name) {
			return fmt.Errorf("session header %q must be 5..40 characters: a letter, then letters, digits, - or _", *n.name)
		}
		svc.HeaderField = strings.ToLower(*n.name)
	}
	return nil
}

// pathPrefix is the one path prefix tether can match a rule's requests by: no matches (all
// paths), or one match on a PathPrefix path with no header, query or method conditions.
func pathPrefix(rule gwv1.HTTPRouteRule) (string, error) {
	switch len(rule.Matches) {
	case 0:
		return "/", nil
	case 1:
	default:
		return "", fmt.Errorf("%d matches: tether identifies a rule's requests by hostnames and one path prefix", len(rule.Matches))
	}
	m := rule.Matches[0]
	if len(m.Headers) > 0 || len(m.QueryParams) > 0 || m.Method != nil {
		return "", fmt.Errorf("header, query or method matches: tether identifies a rule's requests by hostnames and one path prefix")
	}
	if m.Path == nil || m.Path.Value == nil {
		return "/", nil
	}
	if m.Path.Type != nil && *m.Path.Type != gwv1.PathMatchPathPrefix {
		return "", fmt.Errorf("path match type %s: tether matches path prefixes only", *m.Path.Type)
	}
	return *m.Path.Value, nil
}

// gatewayDuration parses a Gateway API Duration (e.g. "1h30m", "500ms").
func gatewayDuration(s string) (time.Duration, error) {
	if !gatewayDurationRe.MatchString(s) {
		return 0, fmt.Errorf("%q is not a Gateway API duration (e.g. 30m, 1h30m, 500ms)", s)
	}
	return time.ParseDuration(s)
}

// backends resolves a rule's backendRefs to instances of service name.
func backends(w World, rt *gwv1.HTTPRoute, rule gwv1.HTTPRouteRule, name string) ([]registry.Instance, []refusal) {
	var bs []backend
	var probs []refusal
	for _, br := range rule.BackendRefs {
		b, prob := resolveBackend(w, rt, br, name)
		switch {
		case prob != nil:
			probs = append(probs, *prob)
		case b.weight > 0: // weight 0: no traffic
			bs = append(bs, b)
		}
	}
	return weighInstances(bs), probs
}

// backend is one backendRef's weight and instances.
type backend struct {
	weight int32
	ins    []registry.Instance
}

// resolveBackend resolves one backendRef of route rt to instances of service name, or says
// why it cannot.
func resolveBackend(w World, rt *gwv1.HTTPRoute, br gwv1.HTTPBackendRef, name string) (backend, *refusal) {
	ref := br.BackendObjectReference
	desc := string(ref.Name)
	refuse := func(reason gwv1.RouteConditionReason, format string, args ...any) (backend, *refusal) {
		return backend{}, &refusal{gwv1.RouteConditionResolvedRefs, reason, fmt.Sprintf(format, args...)}
	}
	if ref.Group != nil && *ref.Group != "" || ref.Kind != nil && *ref.Kind != "Service" {
		return refuse(gwv1.RouteReasonInvalidKind, "backendRef %s is not a core Service (group %q, kind %q)", desc, deref(ref.Group), deref(ref.Kind))
	}
	if ref.Namespace != nil && string(*ref.Namespace) != rt.Namespace {
		return refuse(gwv1.RouteReasonRefNotPermitted, "backendRef %s/%s is in another namespace (tether does not read ReferenceGrants)", *ref.Namespace, desc)
	}
	svcKey := rt.Namespace + "/" + string(ref.Name)
	ks, ok := w.Services[svcKey]
	if !ok {
		return refuse(gwv1.RouteReasonBackendNotFound, "Service %s not found", svcKey)
	}
	if ref.Port == nil {
		return refuse(gwv1.RouteReasonUnsupportedValue, "backendRef %s has no port", desc)
	}
	portName, found := "", false
	for _, sp := range ks.Spec.Ports {
		if sp.Port == *ref.Port {
			portName, found = sp.Name, true
		}
	}
	if !found {
		return refuse(gwv1.RouteReasonBackendNotFound, "Service %s has no port %d", svcKey, *ref.Port)
	}
	weight := int32(1)
	if br.Weight != nil {
		weight = *br.Weight
	}
	if weight <= 0 {
		return backend{}, nil
	}
	if portName == "" {
		// A Service's only port may be unnamed; kubernetes.Instances then takes the slices'
		// only (unnamed) port for HTTP, given an HTTP port name no slice port has.
		portName = "\x00unnamed"
	}
	t := kubernetes.Target{Service: name, Namespace: rt.Namespace, ServiceName: string(ref.Name), HTTPPort: portName}
	return backend{weight: weight, ins: kubernetes.Instances(t, w.Slices[svcKey], nil)}, nil
}

// weighInstances returns the backends' instances, each once. Gateway API weights split
// traffic between backends; tether weighs instances. When the backends' weights differ, each
// endpoint gets its backend's weight divided by the backend's endpoint count, scaled so the
// largest is 1000.
func weighInstances(bs []backend) []registry.Instance {
	equal := true
	for _, b := range bs {
		equal = equal && b.weight == bs[0].weight
	}
	var maxShare float64
	for _, b := range bs {
		if len(b.ins) > 0 {
			maxShare = math.Max(maxShare, float64(b.weight)/float64(len(b.ins)))
		}
	}
	var out []registry.Instance
	seen := map[string]bool{}
	for _, b := range bs {
		for _, in := range b.ins {
			if seen[in.ID] {
				continue // one Pod behind two backends of the rule: once
			}
			seen[in.ID] = true
			if !equal {
				share := float64(b.weight) / float64(len(b.ins))
				in.Weight = uint32(max(1, math.Round(1000*share/maxShare)))
			}
			out = append(out, in)
		}
	}
	return out
}

func deref[T ~string](p *T) string {
	if p == nil {
		return ""
	}
	return string(*p)
}

// conditions are the Accepted, ResolvedRefs (and PartiallyInvalid) conditions of a route.
func conditions(gen int64, accepted []string, refused, unresolved []refusal) []metav1.Condition {
	msg := func(rs []refusal) string {
		var parts []string
		for _, r := range rs {
			parts = append(parts, r.msg)
		}
		return strings.Join(parts, "; ")
	}
	var out []metav1.Condition
	add := func(t gwv1.RouteConditionType, ok bool, reason gwv1.RouteConditionReason, m string) {
		st := metav1.ConditionTrue
		if !ok {
			st = metav1.ConditionFalse
		}
		out = append(out, metav1.Condition{Type: string(t), Status: st, Reason: string(reason), Message: m, ObservedGeneration: gen})
	}
	switch {
	case len(refused) == 0:
		add(gwv1.RouteConditionAccepted, true, gwv1.RouteReasonAccepted,
			"tether serves session persistence of "+strings.Join(accepted, ", "))
	case len(accepted) == 0:
		add(gwv1.RouteConditionAccepted, false, gwv1.RouteReasonUnsupportedValue, msg(refused))
	default:
		add(gwv1.RouteConditionAccepted, true, gwv1.RouteReasonAccepted,
			"tether serves session persistence of "+strings.Join(accepted, ", ")+"; not of the rest")
		add(gwv1.RouteConditionPartiallyInvalid, true, gwv1.RouteReasonUnsupportedValue, msg(refused))
	}
	if len(unresolved) == 0 {
		add(gwv1.RouteConditionResolvedRefs, true, gwv1.RouteReasonResolvedRefs, "all backendRefs resolved")
	} else {
		add(gwv1.RouteConditionResolvedRefs, false, unresolved[0].reason, msg(unresolved))
	}
	slices.SortFunc(out, func(a, b metav1.Condition) int { return cmp.Compare(a.Type, b.Type) })
	return out
}
