// Package kubernetes is a discovery source that follows the EndpointSlices of one Kubernetes
// Service (or of a label selector) with client-go informers and publishes their endpoints as
// one tether service's instances. It is the only package of tether that imports client-go.
//
// Endpoint conditions map onto tether's model:
//
//	ready                         → state active, healthy
//	serving, not ready            → state active, unhealthy (no traffic, sessions wait or move)
//	neither                       → state active, unhealthy
//	terminating (serving or not)  → state draining: its sessions keep it until they end, no new
//	                                ones; healthy while still serving, else unhealthy
//
// The instance id is the endpoint's Pod (targetRef) name, else its hostname, else its address.
// The zone is the endpoint's zone. Weight and standby come from annotations on the endpoint's
// Pod, else on its EndpointSlice: tether.dev/weight ("1".."1000") and tether.dev/standby
// ("true"). The HTTP and SIP ports are the slice's ports of the configured names; a slice
// whose only port has no name (a single-port Service) serves HTTP when no port has the HTTP
// name. FQDN slices are ignored.
//
// RBAC: get, list and watch on endpointslices (discovery.k8s.io) and pods (core) in the
// namespace; see RBACRules.
//
// Faults: while the API server cannot be reached or refuses (RBAC), the source keeps its last
// good set published and reports the error through Sink.SourceFailed; informers re-list with
// back-off and the next complete set clears it.
package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-dev/tether/pkg/registry"
)

// Kind is the source kind reported in the registry's status.
const Kind = "kubernetes"

// Annotations read from an endpoint's Pod or EndpointSlice.
const (
	AnnotationWeight  = "tether.dev/weight"
	AnnotationStandby = "tether.dev/standby"
)

// RBACRules are the Kubernetes RBAC rules (as a Role's rules, in the watched namespace) the
// source needs. The deployment's chart grants these.
const RBACRules = `- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]`

// Sink receives the source's sets; *registry.Registry is one.
type Sink interface {
	UpdateSource(name, kind string, services []registry.Service, instances []registry.Instance) error
	SourceFailed(name, kind string, err error)
}

// Target says what to follow and which tether service it feeds.
type Target struct {
	// Service is the tether service the endpoints become instances of.
	Service string
	// Namespace is the Kubernetes namespace watched.
	Namespace string
	// ServiceName follows the Service's slices (label kubernetes.io/service-name); Selector is
	// a label selector on EndpointSlices instead. Exactly one is set.
	ServiceName, Selector string
	// HTTPPort and SIPPort are port names; "" means none.
	HTTPPort, SIPPort string
}

// Source follows one Target. Create it with New and call Run.
type Source struct {
	client kubernetes.Interface
	sink   Sink
	target Target
	sel    labels.Selector
	name   string
	log    *slog.Logger
}

// Option configures a Source.
type Option func(*Source)

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) Option { return func(s *Source) { s.log = l } }

// RESTConfig loads client settings: the kubeconfig file at path (with context, "" for its
// current one), or the in-cluster service account when path is "".
func RESTConfig(path, context string) (*rest.Config, error) {
	if path == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("kubernetes: in-cluster config (set discovery.kubernetes.kubeconfig outside a cluster): %w", err)
		}
		return cfg, nil
	}
	rules := &clientcmd.ClientConfigLoadingRules{ExplicitPath: path}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: context}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubernetes: kubeconfig %s: %w", path, err)
	}
	return cfg, nil
}

// New returns a source for t that reports to sink under the name "kubernetes/<t.Service>".
func New(cfg *rest.Config, sink Sink, t Target, opts ...Option) (*Source, error) {
	var selector string
	switch {
	case t.ServiceName != "" && t.Selector == "":
		selector = discoveryv1.LabelServiceName + "=" + t.ServiceName
	case t.ServiceName == "" && t.Selector != "":
		selector = t.Selector
	default:
		return nil, errors.New("kubernetes: give a Service name or a selector")
	}
	sel, err := labels.Parse(selector)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: selector %q: %w", selector, err)
	}
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "tether-discovery"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: client: %w", err)
	}
	s := &Source{
		client: client,
		sink:   sink,
		target: t,
		sel:    sel,
		name:   Kind + "/" + t.Service,
		log:    slog.New(slog.DiscardHandler),
	}
	for _, o := range opts {
		o(s)
	}
	return s, nil
}

// Name is the source's name in the registry.
func (s *Source) Name() string { return s.name }

// Run watches until ctx ends. Each change of a watched EndpointSlice or Pod republishes the
// whole set (changes that arrive together are folded into one update). Run returns ctx's error.
func (s *Source) Run(ctx context.Context) error {
	// No periodic resync: every change arrives as an event.
	ns := informers.WithNamespace(s.target.Namespace)
	sliceFactory := informers.NewSharedInformerFactoryWithOptions(s.client, 0, ns,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = s.sel.String() }))
	podFactory := informers.NewSharedInformerFactoryWithOptions(s.client, 0, ns)
	sliceInf := sliceFactory.Discovery().V1().EndpointSlices()
	podInf := podFactory.Core().V1().Pods()

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
	for what, inf := range map[string]cache.SharedIndexInformer{"endpointslices": sliceInf.Informer(), "pods": podInf.Informer()} {
		if _, err := inf.AddEventHandler(handler); err != nil {
			return fmt.Errorf("kubernetes: %s handler: %w", what, err)
		}
		if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
			if ctx.Err() != nil {
				return
			}
			s.log.Warn("kubernetes watch failed; keeping the last good set", "resource", what, "err", err)
			s.sink.SourceFailed(s.name, Kind, fmt.Errorf("watch %s in %s: %w", what, s.target.Namespace, err))
		}); err != nil {
			return fmt.Errorf("kubernetes: %s error handler: %w", what, err)
		}
	}
	sliceFactory.Start(ctx.Done())
	podFactory.Start(ctx.Done())
	defer sliceFactory.Shutdown()
	defer podFactory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), sliceInf.Informer().HasSynced, podInf.Informer().HasSynced) {
		return ctx.Err()
	}
	s.log.Info("kubernetes source synced", "namespace", s.target.Namespace, "selector", s.sel.String())
	notify()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-kick:
		}
		s.publish(sliceInf.Lister(), podInf.Lister())
	}
}

func (s *Source) publish(sl discoverylisters.EndpointSliceLister, pl corelisters.PodLister) {
	list, err := sl.EndpointSlices(s.target.Namespace).List(s.sel)
	if err != nil {
		s.sink.SourceFailed(s.name, Kind, err)
		return
	}
	ins := Instances(s.target, list, func(name string) *corev1.Pod {
		p, err := pl.Pods(s.target.Namespace).Get(name)
		if err != nil {
			return nil
		}
		return p
	})
	if err := s.sink.UpdateSource(s.name, Kind, nil, ins); err != nil {
		s.log.Error("kubernetes source: registry refused the set", "err", err)
		s.sink.SourceFailed(s.name, Kind, err)
	}
}

// Instances maps EndpointSlices to instances of t.Service, sorted by id. pod returns an
// endpoint's Pod by name (nil if unknown). An endpoint found in several slices (a slice being
// replaced) is taken once, preferring a ready one.
func Instances(t Target, list []*discoveryv1.EndpointSlice, pod func(string) *corev1.Pod) []registry.Instance {
	byID := map[string]registry.Instance{}
	for _, slice := range list {
		if slice.AddressType == discoveryv1.AddressTypeFQDN {
			continue
		}
		httpPort, sipPort := ports(slice, t)
		if httpPort == 0 && sipPort == 0 {
			continue
		}
		for _, ep := range slice.Endpoints {
			if len(ep.Addresses) == 0 {
				continue
			}
			in := endpointInstance(t.Service, slice, ep, httpPort, sipPort, pod)
			if prev, ok := byID[in.ID]; ok && prev.Health == registry.HealthHealthy && prev.State == registry.StateActive {
				continue
			}
			byID[in.ID] = in
		}
	}
	out := slices.AppendSeq(make([]registry.Instance, 0, len(byID)), maps.Values(byID))
	slices.SortFunc(out, func(a, b registry.Instance) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// endpointInstance maps endpoint ep of slice, which has an address, to an instance of
// service, with the weight and standby annotations of the slice and the endpoint's Pod.
func endpointInstance(service string, slice *discoveryv1.EndpointSlice, ep discoveryv1.Endpoint, httpPort, sipPort int, pod func(string) *corev1.Pod) registry.Instance {
	in := registry.Instance{
		Service:  service,
		ID:       endpointID(ep),
		Address:  ep.Addresses[0],
		HTTPPort: httpPort,
		SIPPort:  sipPort,
		Weight:   1,
	}
	if ep.Zone != nil {
		in.Zone = *ep.Zone
	}
	in.State, in.Health = conditions(ep.Conditions)
	annotations := slice.Annotations
	if ep.TargetRef != nil && ep.TargetRef.Kind == "Pod" && pod != nil {
		if p := pod(ep.TargetRef.Name); p != nil {
			annotations = mergeAnnotations(slice.Annotations, p.Annotations)
		}
	}
	if w, err := strconv.ParseUint(annotations[AnnotationWeight], 10, 32); err == nil && w >= 1 && w <= 1000 {
		in.Weight = uint32(w)
	}
	if in.State == registry.StateActive && annotations[AnnotationStandby] == "true" {
		in.State = registry.StateStandby
	}
	return in
}

func conditions(c discoveryv1.EndpointConditions) (registry.State, registry.Health) {
	ready := c.Ready == nil || *c.Ready
	serving := ready
	if c.Serving != nil {
		serving = *c.Serving
	}
	terminating := c.Terminating != nil && *c.Terminating
	switch {
	case terminating && serving:
		return registry.StateDraining, registry.HealthHealthy
	case terminating:
		return registry.StateDraining, registry.HealthUnhealthy
	case ready:
		return registry.StateActive, registry.HealthHealthy
	default:
		return registry.StateActive, registry.HealthUnhealthy
	}
}

func ports(slice *discoveryv1.EndpointSlice, t Target) (httpPort, sipPort int) {
	for _, p := range slice.Ports {
		if p.Port == nil || p.Name == nil {
			continue
		}
		switch *p.Name {
		case "":
		case t.HTTPPort:
			if t.HTTPPort != "" {
				httpPort = int(*p.Port)
			}
		case t.SIPPort:
			if t.SIPPort != "" {
				sipPort = int(*p.Port)
			}
		}
	}
	if httpPort == 0 && t.HTTPPort != "" && len(slice.Ports) == 1 && slice.Ports[0].Port != nil &&
		(slice.Ports[0].Name == nil || *slice.Ports[0].Name == "") {
		httpPort = int(*slice.Ports[0].Port)
	}
	return httpPort, sipPort
}

func endpointID(ep discoveryv1.Endpoint) string {
	switch {
	case ep.TargetRef != nil && ep.TargetRef.Name != "":
		return ep.TargetRef.Name
	case ep.Hostname != nil && *ep.Hostname != "":
		return *ep.Hostname
	default:
		return strings.NewReplacer(":", "-", "%", "-").Replace(ep.Addresses[0])
	}
}

// mergeAnnotations returns slice annotations overlaid with the pod's.
func mergeAnnotations(slice, pod map[string]string) map[string]string {
	out := make(map[string]string, len(slice)+len(pod))
	for k, v := range slice {
		out[k] = v
	}
	for k, v := range pod {
		out[k] = v
	}
	return out
}
