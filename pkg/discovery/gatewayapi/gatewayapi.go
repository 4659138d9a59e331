// Package gatewayapi is a discovery source that makes tether services of Gateway API HTTPRoute
// rules that ask for session persistence (GEP-1619, experimental channel), with the endpoints of
// their backend Services as instances, and reports in each route's status what tether honours.
//
// Which routes: those with a parentRef to a Gateway whose spec.gatewayClassName is one of
// Config.GatewayClasses, and those whose labels match Config.RouteSelector (either suffices; at
// least one must be configured). tether writes one status.parents[] entry per such parentRef
// (for a selected route: per parentRef it has) under Config.ControllerName, beside the entries
// of the Gateway's own controller, and leaves the others' entries alone.
//
// Mapping of each rule with sessionPersistence (rules without it are not tether's):
//
//	Gateway API                               tether service
//	type: Cookie (default)                    affinity: cookie
//	type: Header                              affinity: header
//	sessionName | cookie.name                 cookie.name (default tether-session)
//	sessionName | header.name                 headerField, lower-cased (default x-tether-session)
//	absoluteTimeout                           sessionTTL, 1s..6h (default 6h)
//	idleTimeout (before v1.6), or the route   idleTimeout, ≤ sessionTTL (default 30m, capped at
//	  annotation tether.dev/idle-timeout        sessionTTL); the annotation wins; "0" turns it off
//	cookieConfig.lifetimeType | cookie.lifetimeType
//	  Session (default)                       session cookie (no Max-Age)
//	  Permanent                               Max-Age = absoluteTimeout
//	cookie.path                               cookie.path (default: the rule's path prefix)
//	hostnames                                 match.authorities
//	matches: none, or one PathPrefix path     match.pathPrefix
//	backendRefs (core Services, same ns)      instances: the Services' EndpointSlice endpoints on
//	                                          the referenced port (conditions as in package
//	                                          kubernetes: ready, serving, terminating)
//	backendRefs[].weight                      instance weight: equal weights keep the endpoints'
//	                                          own; different ones give each endpoint its
//	                                          backend's weight / endpoint count, scaled to ≤ 1000;
//	                                          weight 0 leaves the backend out
//
// The service of rule i of route ns/name is "<ns>-<name>-<rule name or r<i>>" (cut and hashed
// past 63 characters). The other service settings are the config file's defaults.
//
// Status (per parentRef, observedGeneration = the route's generation):
//
//   - Accepted=True, reason Accepted, when every persistent rule is served; a rule tether cannot
//     honour (absoluteTimeout out of range or malformed, an idle timeout over the absolute one, a
//     Permanent cookie without absoluteTimeout, a bad cookie or header name, matches other than
//     one path prefix) is not served at all — the Gateway still routes it, without tether's
//     persistence — and makes Accepted=False, reason UnsupportedValue, when no persistent rule
//     is left, else PartiallyInvalid=True, reason UnsupportedValue; the message names each rule
//     and why.
//   - ResolvedRefs=True, or False with BackendNotFound (no such Service, or no such port),
//     InvalidKind (not a core Service), RefNotPermitted (another namespace: tether does not
//     read ReferenceGrants) or UnsupportedValue (no port). The rule is still served, by the
//     backends that resolve.
//
// RBAC: RBACRules (cluster-wide when Config.Namespace is "").
//
// Faults: while the API server cannot be reached or refuses, the last good set stays published
// and the error is reported through Sink.SourceFailed; a status write that fails (a conflict
// with another writer, say) is retried on the next change or after a second.
package gatewayapi

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/tether-dev/tether/pkg/registry"
)

// Kind is the source kind in the registry's status; SourceName its name there.
const (
	Kind       = "gateway-api"
	SourceName = "gateway-api"
)

// AnnotationIdleTimeout on an HTTPRoute sets the idle timeout of its persistent rules (a Gateway
// API duration, or "0" for none): the Gateway API dropped idleTimeout, tether keeps it.
const AnnotationIdleTimeout = "tether.dev/idle-timeout"

// DefaultControllerName is the controllerName tether writes in status.parents[].
const DefaultControllerName = "tether.dev/session-persistence"

// RBACRules are the rules (as a ClusterRole's, or a Role's in Config.Namespace) the source
// needs; the Helm chart grants them. Gateways are read only with Config.GatewayClasses.
const RBACRules = `- apiGroups: ["gateway.networking.k8s.io"]
  resources: ["httproutes", "gateways"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["gateway.networking.k8s.io"]
  resources: ["httproutes/status"]
  verbs: ["update"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "list", "watch"]`

// Resources read.
var (
	HTTPRoutes = schema.GroupVersionResource{Group: gwv1.GroupName, Version: "v1", Resource: "httproutes"}
	Gateways   = schema.GroupVersionResource{Group: gwv1.GroupName, Version: "v1", Resource: "gateways"}
)

// Sink receives the source's sets; *registry.Registry is one.
type Sink interface {
	UpdateSource(name, kind string, services []registry.Service, instances []registry.Instance) error
	SourceFailed(name, kind string, err error)
}

// Config says which routes are tether's and how services are made.
type Config struct {
	// ControllerName is written in status.parents[].controllerName (DefaultControllerName if
	// empty).
	ControllerName string
	// Namespace limits the source to one namespace; "" watches all.
	Namespace string
	// GatewayClasses selects routes attached to Gateways of these classes.
	GatewayClasses []string
	// RouteSelector selects routes by label (k=v, k!=v, k, !k, comma-separated).
	RouteSelector string
	// Defaults returns a service named name with the given affinity and every other field at
	// tether's defaults (config.DefaultService).
	Defaults func(name string, mode registry.AffinityMode) registry.Service
}

// Source follows the routes of a Config. Create it with New and call Run.
type Source struct {
	cfg  Config
	kube kubernetes.Interface
	dyn  dynamic.Interface
	sink Sink
	log  *slog.Logger
}

// Option configures a Source.
type Option func(*Source)

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) Option { return func(s *Source) { s.log = l } }

// New returns a source for cfg reporting to sink as SourceName.
func New(rc *rest.Config, sink Sink, cfg Config, opts ...Option) (*Source, error) {
	if cfg.ControllerName == "" {
		cfg.ControllerName = DefaultControllerName
	}
	if len(cfg.GatewayClasses) == 0 && cfg.RouteSelector == "" {
		return nil, errors.New("gateway-api: give gatewayClasses or a routeSelector")
	}
	if cfg.RouteSelector != "" {
		if _, err := labels.Parse(cfg.RouteSelector); err != nil {
			return nil, fmt.Errorf("gateway-api: routeSelector %q: %w", cfg.RouteSelector, err)
		}
	}
	if cfg.Defaults == nil {
		return nil, errors.New("gateway-api: Config.Defaults is required")
	}
	rc = rest.CopyConfig(rc)
	rc.UserAgent = "tether-gateway-api"
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("gateway-api: client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("gateway-api: client: %w", err)
	}
	s := &Source{cfg: cfg, kube: kube, dyn: dyn, sink: sink, log: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(s)
	}
	return s, nil
}

// Run watches until ctx ends and returns ctx's error. Every change of a watched object
// recomputes the whole set (changes that arrive together fold into one update) and the
// statuses that differ from what tether last wrote.
func (s *Source) Run(ctx context.Context) error {
	ns := s.cfg.Namespace // "" is metav1.NamespaceAll
	kf := informers.NewSharedInformerFactoryWithOptions(s.kube, 0, informers.WithNamespace(ns))
	df := dynamicinformer.NewFilteredDynamicSharedInformerFactory(s.dyn, 0, ns, nil)
	routes := df.ForResource(HTTPRoutes).Informer()
	svcs := kf.Core().V1().Services().Informer()
	eps := kf.Discovery().V1().EndpointSlices().Informer()
	watched := map[string]cache.SharedIndexInformer{"httproutes": routes, "services": svcs, "endpointslices": eps}
	var gateways cache.SharedIndexInformer
	if len(s.cfg.GatewayClasses) > 0 {
		gateways = df.ForResource(Gateways).Informer()
		watched["gateways"] = gateways
	}

	kick := make(chan struct{}, 1)
	notify := func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { notify() },
		UpdateFunc: func(any, any) { notify() },
		DeleteFunc: func(any) { notify() },
	}
	if err := s.handle(ctx, watched, handler); err != nil {
		return err
	}
	kf.Start(ctx.Done())
	df.Start(ctx.Done())
	defer kf.Shutdown()
	defer df.Shutdown()
	var synced []cache.InformerSynced
	for _, inf := range watched {
		synced = append(synced, inf.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return ctx.Err()
	}
	s.log.Info("gateway-api source synced", "namespace", ns, "gatewayClasses", s.cfg.GatewayClasses, "routeSelector", s.cfg.RouteSelector)
	notify()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-kick:
		case <-retry.C:
		}
		w := s.world(routes, gateways, svcs, eps)
		res := Translate(s.cfg, w)
		if err := s.sink.UpdateSource(SourceName, Kind, res.Services, res.Instances); err != nil {
			s.log.Error("gateway-api source: registry refused the set", "err", err)
			s.sink.SourceFailed(SourceName, Kind, err)
		}
		if err := s.writeStatus(ctx, routes, res.Status); err != nil && ctx.Err() == nil {
			s.log.Warn("gateway-api: route status not written; retrying", "err", err)
			retry.Reset(time.Second)
		}
	}
}

// handle adds handler to each watched informer, and a watch error handler that reports the
// source failing (until ctx ends).
func (s *Source) handle(ctx context.Context, watched map[string]cache.SharedIndexInformer, handler cache.ResourceEventHandler) error {
	for what, inf := range watched {
		if _, err := inf.AddEventHandler(handler); err != nil {
			return fmt.Errorf("gateway-api: %s handler: %w", what, err)
		}
		if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
			if ctx.Err() != nil {
				return
			}
			s.log.Warn("gateway-api watch failed; keeping the last good set", "resource", what, "err", err)
			s.sink.SourceFailed(SourceName, Kind, fmt.Errorf("watch %s: %w", what, err))
		}); err != nil {
			return fmt.Errorf("gateway-api: %s error handler: %w", what, err)
		}
	}
	return nil
}

// world reads the informers' caches.
func (s *Source) world(routes, gateways, svcs, eps cache.SharedIndexInformer) World {
	w := World{GatewayClass: map[string]string{}, Services: map[string]*corev1.Service{}, Slices: map[string][]*discoveryv1.EndpointSlice{}}
	for _, o := range routes.GetStore().List() {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		js, err := u.MarshalJSON()
		if err != nil {
			continue
		}
		var rt gwv1.HTTPRoute
		if err := json.Unmarshal(js, &rt); err != nil {
			s.log.Warn("gateway-api: route not readable", "route", u.GetNamespace()+"/"+u.GetName(), "err", err)
			continue
		}
		w.Routes = append(w.Routes, Route{Typed: &rt, JSON: js})
	}
	slices.SortFunc(w.Routes, func(a, b Route) int {
		return compareKeys(a.Typed.Namespace, a.Typed.Name, b.Typed.Namespace, b.Typed.Name)
	})
	if gateways != nil {
		for _, o := range gateways.GetStore().List() {
			u, ok := o.(*unstructured.Unstructured)
			if !ok {
				continue
			}
			class, _, _ := unstructured.NestedString(u.Object, "spec", "gatewayClassName")
			w.GatewayClass[u.GetNamespace()+"/"+u.GetName()] = class
		}
	}
	for _, o := range svcs.GetStore().List() {
		if ks, ok := o.(*corev1.Service); ok {
			w.Services[ks.Namespace+"/"+ks.Name] = ks
		}
	}
	for _, o := range eps.GetStore().List() {
		if sl, ok := o.(*discoveryv1.EndpointSlice); ok {
			if svc := sl.Labels[discoveryv1.LabelServiceName]; svc != "" {
				k := sl.Namespace + "/" + svc
				w.Slices[k] = append(w.Slices[k], sl)
			}
		}
	}
	for _, list := range w.Slices {
		slices.SortFunc(list, func(a, b *discoveryv1.EndpointSlice) int {
			return compareKeys(a.Namespace, a.Name, b.Namespace, b.Name)
		})
	}
	return w
}

func compareKeys(ans, an, bns, bn string) int {
	return cmp.Or(cmp.Compare(ans, bns), cmp.Compare(an, bn))
}

// writeStatus replaces tether's entries in status.parents of every route whose entries differ
// from want (ignoring lastTransitionTime, which is kept for conditions whose status did not
// change), leaving other controllers' entries as they are.
func (s *Source) writeStatus(ctx context.Context, routes cache.SharedIndexInformer, want map[string][]gwv1.RouteParentStatus) error {
	var errs []error
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	for key, mine := range want {
		o, exists, err := routes.GetStore().GetByKey(key)
		if err != nil || !exists {
			continue
		}
		u := o.(*unstructured.Unstructured)
		var cur struct {
			Status gwv1.HTTPRouteStatus `json:"status"`
		}
		js, _ := u.MarshalJSON()
		if err := json.Unmarshal(js, &cur); err != nil {
			errs = append(errs, err)
			continue
		}
		var others, old []gwv1.RouteParentStatus
		for _, p := range cur.Status.Parents {
			if string(p.ControllerName) == s.cfg.ControllerName {
				old = append(old, p)
			} else {
				others = append(others, p)
			}
		}
		for i := range mine {
			for j := range mine[i].Conditions {
				c := &mine[i].Conditions[j]
				c.LastTransitionTime = now
				if prev := findCondition(old, mine[i].ParentRef, c.Type); prev != nil && prev.Status == c.Status {
					c.LastTransitionTime = prev.LastTransitionTime
				}
			}
		}
		if sameStatus(old, mine) {
			continue
		}
		parents := append(others, mine...)
		pm, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&gwv1.HTTPRouteStatus{RouteStatus: gwv1.RouteStatus{Parents: parents}})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		obj := u.DeepCopy()
		if parents == nil {
			pm["parents"] = []any{}
		}
		obj.Object["status"] = pm
		if _, err := s.dyn.Resource(HTTPRoutes).Namespace(u.GetNamespace()).UpdateStatus(ctx, obj, metav1.UpdateOptions{FieldManager: "tether"}); err != nil {
			errs = append(errs, fmt.Errorf("status of HTTPRoute %s: %w", key, err))
		}
	}
	return errors.Join(errs...)
}

func findCondition(list []gwv1.RouteParentStatus, ref gwv1.ParentReference, typ string) *metav1.Condition {
	for i := range list {
		if reflect.DeepEqual(list[i].ParentRef, ref) {
			for j := range list[i].Conditions {
				if list[i].Conditions[j].Type == typ {
					return &list[i].Conditions[j]
				}
			}
		}
	}
	return nil
}

// sameStatus compares parent statuses as the API server stores them (JSON), so defaulted
// fields and times at second precision compare equal.
func sameStatus(a, b []gwv1.RouteParentStatus) bool {
	if len(a) == 0 && len(b) == 0 {
		return true
	}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}
