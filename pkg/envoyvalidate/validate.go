// Package envoyvalidate checks Envoy configuration without an Envoy binary: it parses YAML or
// JSON into go-control-plane's v3 types, runs the protoc-gen-validate rules (ValidateAll) on
// every message — including every message packed in a google.protobuf.Any or an
// xds.type.v3.TypedStruct, which the generated validators skip — and checks that every cluster a
// configuration names (route actions, gRPC services, ADS/API config sources, HTTP URIs, TCP
// proxies) exists.
//
// It checks field constraints and references only; whether Envoy has an extension compiled in
// or accepts a runtime key needs `envoy --mode validate`.
package envoyvalidate

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"sigs.k8s.io/yaml"
)

// Option configures a validation.
type Option func(*options)

type options struct {
	clusters map[string]bool
}

// WithClusters declares clusters that exist outside the configuration being validated: for a
// bootstrap, the clusters it will receive over CDS; for a snapshot, the bootstrap's static
// clusters (e.g. tether_ext_proc). References to them are accepted.
func WithClusters(names ...string) Option {
	return func(o *options) {
		for _, n := range names {
			o.clusters[n] = true
		}
	}
}

func newOptions(opts []Option) *options {
	o := &options{clusters: map[string]bool{}}
	for _, f := range opts {
		f(o)
	}
	return o
}

// ParseBootstrap parses an Envoy v3 bootstrap from YAML or JSON. Unknown fields and
// unresolvable @types are errors.
func ParseBootstrap(data []byte) (*bootstrapv3.Bootstrap, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("parse bootstrap: %w", err)
	}
	b := &bootstrapv3.Bootstrap{}
	if err := protojson.Unmarshal(js, b); err != nil {
		return nil, fmt.Errorf("parse bootstrap: %w (an unresolvable @type needs a blank import in pkg/envoyvalidate/extensions.go)", err)
	}
	return b, nil
}

// ValidateBootstrapYAML parses data (YAML or JSON) as a bootstrap and runs ValidateBootstrap.
func ValidateBootstrapYAML(data []byte, opts ...Option) error {
	b, err := ParseBootstrap(data)
	if err != nil {
		return err
	}
	return ValidateBootstrap(b, opts...)
}

// ValidateBootstrap validates every message of b (recursing into Any and TypedStruct), checks
// that static clusters and listeners have unique names, and that every referenced cluster is a
// static cluster or was declared with WithClusters. All problems are reported, one per line.
func ValidateBootstrap(b *bootstrapv3.Bootstrap, opts ...Option) error {
	o := newOptions(opts)
	w := &walker{}
	w.check(b, "bootstrap")
	known := map[string]bool{}
	for n := range o.clusters {
		known[n] = true
	}
	static := map[string]bool{}
	for i, c := range b.GetStaticResources().GetClusters() {
		if static[c.GetName()] {
			w.problem(fmt.Sprintf("bootstrap.static_resources.clusters[%d]", i), "duplicate cluster name %q", c.GetName())
		}
		static[c.GetName()] = true
		known[c.GetName()] = true
	}
	listeners := map[string]bool{}
	for i, l := range b.GetStaticResources().GetListeners() {
		if listeners[l.GetName()] {
			w.problem(fmt.Sprintf("bootstrap.static_resources.listeners[%d]", i), "duplicate listener name %q", l.GetName())
		}
		listeners[l.GetName()] = true
	}
	w.resolve(known)
	return w.err()
}

// ValidateResources validates each message (recursing into Any and TypedStruct). It checks
// field constraints only, not references between resources.
func ValidateResources(msgs ...proto.Message) error {
	w := &walker{}
	for i, m := range msgs {
		name := fmt.Sprintf("resource[%d]", i)
		if n := cache.GetResourceName(m); n != "" {
			name = fmt.Sprintf("%s %q", m.ProtoReflect().Descriptor().Name(), n)
		}
		w.check(m, name)
	}
	return w.err()
}

// ValidateSnapshot validates an xDS snapshot: Consistent() (every EDS resource named by a
// cluster and vice versa, every RDS resource named by a listener), every resource's fields
// (recursing into Any and TypedStruct), resource names matching their keys, and every
// referenced cluster being in the snapshot's clusters or declared with WithClusters.
func ValidateSnapshot(s *cache.Snapshot, opts ...Option) error {
	if s == nil {
		return errors.New("nil snapshot")
	}
	o := newOptions(opts)
	w := &walker{}
	if err := s.Consistent(); err != nil {
		w.problem("snapshot", "%v", err)
	}
	known := map[string]bool{}
	for n := range o.clusters {
		known[n] = true
	}
	for name := range s.GetResources(resource.ClusterType) {
		known[name] = true
	}
	for _, typ := range []resource.Type{resource.ClusterType, resource.EndpointType, resource.ListenerType, resource.RouteType, resource.SecretType, resource.RuntimeType, resource.ScopedRouteType, resource.VirtualHostType, resource.ExtensionConfigType} {
		items := s.GetResources(typ)
		for _, name := range sortedKeys(items) {
			m := items[name]
			path := fmt.Sprintf("%s %q", typ[strings.LastIndex(typ, ".")+1:], name)
			if got := cache.GetResourceName(m); got != name {
				w.problem(path, "resource is named %q", got)
			}
			w.check(m, path)
		}
	}
	w.resolve(known)
	return w.err()
}

func sortedKeys(m map[string]types.Resource) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// LooksLikeBootstrap reports whether data is a YAML or JSON mapping with a top-level key only
// an Envoy bootstrap has (static_resources, dynamic_resources, node, admin, layered_runtime)
// and no apiVersion (tether's own config files have one).
func LooksLikeBootstrap(data []byte) bool {
	var top map[string]any
	if err := yaml.Unmarshal(data, &top); err != nil {
		return false
	}
	if _, ok := top["apiVersion"]; ok {
		return false
	}
	for _, k := range []string{"static_resources", "dynamic_resources", "node", "admin", "layered_runtime", "staticResources", "dynamicResources"} {
		if _, ok := top[k]; ok {
			return true
		}
	}
	return false
}

// walker validates a message tree and collects cluster references.
type walker struct {
	problems []string
	refs     []ref
}

type ref struct {
	path, cluster string
}

func (w *walker) problem(path, format string, args ...any) {
	w.problems = append(w.problems, path+": "+fmt.Sprintf(format, args...))
}

func (w *walker) err() error {
	if len(w.problems) == 0 {
		return nil
	}
	return errors.New(strings.Join(w.problems, "\n"))
}

// check validates m (ValidateAll) and then walks it.
func (w *walker) check(m proto.Message, path string) {
	w.validate(m, path)
	w.walk(m.ProtoReflect(), path)
}

func (w *walker) validate(m proto.Message, path string) {
	v, ok := m.(interface{ ValidateAll() error })
	if !ok {
		return
	}
	if err := v.ValidateAll(); err != nil {
		var multi interface{ AllErrors() []error }
		if errors.As(err, &multi) {
			for _, e := range multi.AllErrors() {
				w.problem(path, "%v", e)
			}
			return
		}
		w.problem(path, "%v", err)
	}
}

const (
	anyName          = protoreflect.FullName("google.protobuf.Any")
	typedStructXDS   = protoreflect.FullName("xds.type.v3.TypedStruct")
	typedStructUDPA  = protoreflect.FullName("udpa.type.v1.TypedStruct")
	maxTypedNestings = 64
)

// walk visits every set message field of m. An Any is unpacked, validated and walked; so is a
// TypedStruct (its Struct converted to the named type).
func (w *walker) walk(m protoreflect.Message, path string) {
	if strings.Count(path, "(") > maxTypedNestings {
		w.problem(path, "typed configs nested too deep")
		return
	}
	switch m.Descriptor().FullName() {
	case anyName:
		w.walkAny(m, path)
		return
	case typedStructXDS, typedStructUDPA:
		w.walkTypedStruct(m, path)
		return
	}
	w.collectRefs(m.Interface(), path)
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		name := string(fd.Name())
		switch {
		case fd.IsList() && isMessage(fd):
			l := v.List()
			for i := range l.Len() {
				w.walk(l.Get(i).Message(), fmt.Sprintf("%s.%s[%d]", path, name, i))
			}
		case fd.IsMap() && isMessage(fd.MapValue()):
			var keys []protoreflect.MapKey
			v.Map().Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool {
				keys = append(keys, k)
				return true
			})
			slices.SortFunc(keys, func(a, b protoreflect.MapKey) int { return cmp.Compare(a.String(), b.String()) })
			for _, k := range keys {
				w.walk(v.Map().Get(k).Message(), fmt.Sprintf("%s.%s[%s]", path, name, k.String()))
			}
		case !fd.IsList() && !fd.IsMap() && isMessage(fd):
			w.walk(v.Message(), path+"."+name)
		}
		return true
	})
}

func isMessage(fd protoreflect.FieldDescriptor) bool {
	return fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind
}

func (w *walker) walkAny(m protoreflect.Message, path string) {
	a, ok := m.Interface().(*anypb.Any)
	if !ok {
		// A dynamic Any: re-marshal into the concrete type.
		b, err := proto.Marshal(m.Interface())
		if err != nil {
			w.problem(path, "any: %v", err)
			return
		}
		a = &anypb.Any{}
		if err := proto.Unmarshal(b, a); err != nil {
			w.problem(path, "any: %v", err)
			return
		}
	}
	inner, err := a.UnmarshalNew()
	if err != nil {
		w.problem(path, "cannot unpack @type %q: %v (add its package to pkg/envoyvalidate/extensions.go)", a.GetTypeUrl(), err)
		return
	}
	p := fmt.Sprintf("%s(%s)", path, inner.ProtoReflect().Descriptor().Name())
	w.check(inner, p)
}

func (w *walker) walkTypedStruct(m protoreflect.Message, path string) {
	fields := m.Descriptor().Fields()
	typeURL := m.Get(fields.ByName("type_url")).String()
	var value *structpb.Struct
	if fd := fields.ByName("value"); m.Has(fd) {
		s, ok := m.Get(fd).Message().Interface().(*structpb.Struct)
		if !ok {
			w.problem(path, "typed struct: unexpected value type")
			return
		}
		value = s
	}
	name := typeURL[strings.LastIndex(typeURL, "/")+1:]
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(name))
	if err != nil {
		w.problem(path, "cannot resolve typed struct type %q: %v (add its package to pkg/envoyvalidate/extensions.go)", typeURL, err)
		return
	}
	js, err := protojson.Marshal(value)
	if err != nil {
		w.problem(path, "typed struct: %v", err)
		return
	}
	inner := mt.New().Interface()
	if !bytes.Equal(js, []byte("null")) {
		if err := protojson.Unmarshal(js, inner); err != nil {
			w.problem(path, "typed struct %q: %v", typeURL, err)
			return
		}
	}
	w.check(inner, fmt.Sprintf("%s(%s)", path, inner.ProtoReflect().Descriptor().Name()))
}

// collectRefs records the clusters m names, and checks the few cross-field rules Envoy enforces
// beyond protoc-gen-validate that tether's configurations could break.
func (w *walker) collectRefs(m proto.Message, path string) {
	add := func(field, cluster string) {
		if cluster != "" {
			w.refs = append(w.refs, ref{path: path + "." + field, cluster: cluster})
		}
	}
	switch m := m.(type) {
	case *routev3.RouteAction:
		add("cluster", m.GetCluster())
		for i, wc := range m.GetWeightedClusters().GetClusters() {
			add(fmt.Sprintf("weighted_clusters.clusters[%d].name", i), wc.GetName())
		}
		for i, mp := range m.GetRequestMirrorPolicies() {
			add(fmt.Sprintf("request_mirror_policies[%d].cluster", i), mp.GetCluster())
		}
	case *corev3.GrpcService_EnvoyGrpc:
		add("cluster_name", m.GetClusterName())
	case *corev3.ApiConfigSource:
		for i, n := range m.GetClusterNames() {
			add(fmt.Sprintf("cluster_names[%d]", i), n)
		}
	case *corev3.HttpUri:
		add("cluster", m.GetCluster())
	case *routev3.RouteConfiguration:
		w.uniqueVirtualHosts(m, path)
	case *tcpproxyv3.TcpProxy:
		add("cluster", m.GetCluster())
		for i, wc := range m.GetWeightedClusters().GetClusters() {
			add(fmt.Sprintf("weighted_clusters.clusters[%d].name", i), wc.GetName())
		}
	}
}

// uniqueVirtualHosts checks route table m (at path): Envoy refuses one with repeated virtual
// host names or domains.
func (w *walker) uniqueVirtualHosts(m *routev3.RouteConfiguration, path string) {
	vhosts, domains := map[string]bool{}, map[string]bool{}
	for i, vh := range m.GetVirtualHosts() {
		if vhosts[vh.GetName()] {
			w.problem(fmt.Sprintf("%s.virtual_hosts[%d]", path, i), "duplicate virtual host name %q", vh.GetName())
		}
		vhosts[vh.GetName()] = true
		for _, d := range vh.GetDomains() {
			if domains[strings.ToLower(d)] {
				w.problem(fmt.Sprintf("%s.virtual_hosts[%d]", path, i), "domain %q in more than one virtual host", d)
			}
			domains[strings.ToLower(d)] = true
		}
	}
}

// resolve reports every reference to a cluster not in known.
func (w *walker) resolve(known map[string]bool) {
	for _, r := range w.refs {
		if !known[r.cluster] {
			w.problem(r.path, "unknown cluster %q", r.cluster)
		}
	}
}
