package edscache

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// Cache is tether's EDS cache: one set of ClusterLoadAssignments shared by every node,
// served through go-control-plane's state-of-the-world and delta ADS servers (it implements
// cache.Cache behind the MuxCache). It replaces go-control-plane's LinearCache, which indexes
// every open watch under each resource name it subscribes to: with an Envoy subscribed to 1,000
// clusters, each push and each ACK removed and re-inserted 1,000 map entries per client, under
// one lock, so one endpoint change took seconds to reach a fleet of 1,000.
//
// Here a watch is registered once, in one map (not under each name). A change to a set M of
// resources visits every open watch and tests only the names in M against its subscription,
// under the lock; everything proportional to the size of a client's subscription (its map of returned
// versions, its version_info) is computed when the client's own stream goroutine sends the
// response, in parallel across streams. Each resource is marshalled once per version, into an
// Any that every response shares.
//
// Versions are content-derived, never counters, so every replica serves the same versions for
// the same registry state:
//   - a resource's version (delta's Resource.version, and the per-resource versions the servers
//     track) is given by the publisher (edsVersion): a hash of the CLA's deterministic wire form
//     and of the clusters that use it;
//   - a state-of-the-world version_info, and a delta system_version_info, is versionSum of the
//     (name, version) pairs the client holds after the response: the same set always gives the
//     same string, whatever order it was built in.
//
// A state-of-the-world client that opens a new stream (to this replica or another) with the
// version_info it last acknowledged, and whose subscription the current resources give exactly
// that version_info, already holds them: it gets no response until something changes. A delta
// client's initial_resource_versions are compared resource by resource. A NACKed response is
// not re-sent: the servers record what was sent, and the cache waits for the next change.
//
// Safe for concurrent use.
type Cache struct {
	state atomic.Pointer[edsState] // immutable; replaced by update

	mu      sync.Mutex // serializes update and guards the fields below and every watch's state
	watches map[uint64]*edsWatch
	nextID  uint64
}

var _ cache.Cache = (*Cache)(nil)

// edsState is one immutable generation of the cache's resources, by name.
type edsState map[string]*Resource

// Resource is one ClusterLoadAssignment at one version, marshalled once. Immutable.
type Resource struct {
	name    string
	version string
	tag     uint64                // versionTag(name, version)
	any     *anypb.Any            // shared by every SotW response
	delta   *discoveryv3.Resource // shared by every delta response
}

// NewResource marshals m, the ClusterLoadAssignment named name, deterministically and
// versions it: the version is edsVersion(the wire form's hash, salt). It also returns that
// hash.
func NewResource(name string, m proto.Message, salt uint64) (*Resource, uint64, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return nil, 0, fmt.Errorf("marshal %s: %w", name, err)
	}
	sum := xxhash.Sum64(b)
	v := edsVersion(sum, salt)
	a := &anypb.Any{TypeUrl: resource.EndpointType, Value: b}
	return &Resource{
		name: name, version: v, tag: versionTag(name, v), any: a,
		delta: &discoveryv3.Resource{Name: name, Version: v, Resource: a},
	}, sum, nil
}

// edsVersion is a CLA's version: a hash of its content hash and salt (the hash of the
// clusters that use it, so that a changed cluster, which Envoy re-warms, gets its endpoints
// again even when they did not change).
func edsVersion(sum, salt uint64) string {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], sum)
	binary.BigEndian.PutUint64(b[8:], salt)
	return strconv.FormatUint(xxhash.Sum64(b[:]), 16)
}

// versionTag is one (name, version) pair's share of versionSum.
func versionTag(name, version string) uint64 {
	d := xxhash.New()
	_, _ = d.WriteString(name)
	_, _ = d.Write([]byte{0})
	_, _ = d.WriteString(version)
	return d.Sum64()
}

// New returns an empty cache.
func New() *Cache {
	c := &Cache{watches: map[uint64]*edsWatch{}}
	c.state.Store(&edsState{})
	return c
}

// Update sets the resources in set and deletes those named in del, then tells every open watch
// the change concerns: a watch whose client lacks a changed resource gets a response ticket
// (one at a time per watch; the ticket carries whatever is due when its stream sends it).
func (c *Cache) Update(set []*Resource, del []string) {
	if len(set)+len(del) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	next := maps.Clone(*c.state.Load())
	modified := make([]string, 0, len(set)+len(del))
	for _, r := range set {
		next[r.name] = r
		modified = append(modified, r.name)
	}
	for _, name := range del {
		delete(next, name)
		modified = append(modified, name)
	}
	c.state.Store(&next)
	for _, w := range c.watches {
		w.onChange(next, modified)
	}
}

// CreateWatch implements cache.ConfigWatcher for state-of-the-world streams.
func (c *Cache) CreateWatch(req *cache.Request, sub cache.Subscription, out chan cache.Response) (func(), error) {
	if req.GetTypeUrl() != resource.EndpointType {
		return nil, fmt.Errorf("xds: endpoint cache cannot serve %s", req.GetTypeUrl())
	}
	w := &edsWatch{c: c, sotw: req, sub: sub, sotwOut: out}
	// The first request of a stream (no version) is always answered, even when empty.
	return c.register(w, req.GetVersionInfo() == "", func(st edsState, known map[string]string, d diff) (map[string]string, diff) {
		if len(d.changed) > 0 && len(known) == 0 && req.GetVersionInfo() != "" && req.GetResponseNonce() == "" {
			// A new stream from a client that holds a version: if the resources it subscribes
			// to give exactly that version, it holds them already.
			if strconv.FormatUint(d.sum(), 16) == req.GetVersionInfo() {
				held := make(map[string]string, len(d.changed))
				for _, r := range d.changed {
					held[r.name] = r.version
				}
				return held, diff{held: d.sum()}
			}
		}
		return known, d
	}), nil
}

// CreateDeltaWatch implements cache.ConfigWatcher for delta streams.
func (c *Cache) CreateDeltaWatch(req *cache.DeltaRequest, sub cache.Subscription, out chan cache.DeltaResponse) (func(), error) {
	if req.GetTypeUrl() != resource.EndpointType {
		return nil, fmt.Errorf("xds: endpoint cache cannot serve %s", req.GetTypeUrl())
	}
	w := &edsWatch{c: c, delta: req, sub: sub, deltaOut: out}
	// A wildcard subscription's first request is answered even when empty: Envoy waits for it
	// to finish initialising.
	first := sub.IsWildcard() && req.GetResponseNonce() == ""
	return c.register(w, first, func(_ edsState, known map[string]string, d diff) (map[string]string, diff) { return known, d }), nil
}

// register opens w, which persists until its cancel function is called: it compares what the
// subscription holds with the current state (in O(subscription), as go-control-plane's server
// itself rebuilds the subscription for every request it passes on), lets adjust replace what
// the client is counted to hold, and queues a response when the client lacks something (or
// always, when answer is set).
func (c *Cache) register(w *edsWatch, answer bool, adjust func(edsState, map[string]string, diff) (map[string]string, diff)) func() {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := *c.state.Load()
	known := w.sub.ReturnedResources()
	if known == nil {
		known = map[string]string{}
	}
	known, d := adjust(st, known, changes(st, w.sub, known))
	w.known, w.st, w.base = known, st, d.held
	for _, r := range d.changed {
		w.mark(r.name)
	}
	for _, name := range d.removed {
		if w.sotw != nil {
			// State of the world cannot express a removal; the client is just no longer
			// counted to hold it. (Every removed name is in known and not in base.)
			delete(known, name)
			continue
		}
		w.mark(name)
	}
	c.nextID++
	id := c.nextID
	c.watches[id] = w
	if answer || len(w.dirty) > 0 {
		w.ticket()
	}
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if _, ok := c.watches[id]; !ok {
			return
		}
		delete(c.watches, id)
		w.cancelled = true
	}
}

// Fetch implements cache.ConfigFetcher; tether serves no REST xDS.
func (c *Cache) Fetch(context.Context, *cache.Request) (cache.Response, error) {
	return nil, errors.New("xds: the endpoint cache serves no fetch requests")
}

// diff is what a subscription lacks against a state: the resources to send (new to the client,
// or at another version), the names to drop (known but gone, or no longer subscribed), and held,
// the versionTag sum of the subscribed resources the client already holds at their current
// version.
type diff struct {
	changed []*Resource
	removed []string
	held    uint64
}

// sum is the version_info the client has once it receives changed.
func (d diff) sum() uint64 {
	s := d.held
	for _, r := range d.changed {
		s += r.tag
	}
	return s
}

func changes(st edsState, sub cache.Subscription, known map[string]string) diff {
	var d diff
	if sub.IsWildcard() {
		for name, r := range st {
			if v, ok := known[name]; ok && v == r.version {
				d.held += r.tag
			} else {
				d.changed = append(d.changed, r)
			}
		}
		for name := range known {
			if _, ok := st[name]; !ok {
				d.removed = append(d.removed, name)
			}
		}
		return d
	}
	subscribed := sub.SubscribedResources()
	for name := range subscribed {
		r, exists := st[name]
		v, isKnown := known[name]
		switch {
		case !exists && isKnown:
			d.removed = append(d.removed, name)
		case !exists:
		case isKnown && v == r.version:
			d.held += r.tag
		default:
			d.changed = append(d.changed, r)
		}
	}
	for name := range known {
		if _, ok := subscribed[name]; !ok {
			d.removed = append(d.removed, name)
		}
	}
	return d
}

// edsWatch is one stream's subscription (state of the world: sotw set; or delta), open from one
// request until the server cancels it at the next request or at the end of the stream.
type edsWatch struct {
	c        *Cache
	sotw     *cache.Request
	delta    *cache.DeltaRequest
	sub      cache.Subscription
	sotwOut  chan cache.Response
	deltaOut chan cache.DeltaResponse

	// Guarded by c.mu. known is what the client is counted to hold (name → version): the map the
	// server keeps as the subscription's returned resources, edited in place (the server edits
	// it only between cancelling this watch and opening the next). Every entry is subscribed;
	// base is the versionTag sum of the entries at their version in st, the state of the last
	// response (or of the registration). dirty names what changed since; pending is set while
	// a ticket waits in the stream's channel.
	known     map[string]string
	st        edsState
	base      uint64
	dirty     map[string]struct{}
	pending   bool
	cancelled bool
}

func (w *edsWatch) interested(name string) bool {
	if w.sub.IsWildcard() {
		return true
	}
	_, ok := w.sub.SubscribedResources()[name]
	return ok
}

func (w *edsWatch) mark(name string) {
	if w.dirty == nil {
		w.dirty = map[string]struct{}{}
	}
	w.dirty[name] = struct{}{}
}

// ticket queues a response unless one is queued already. The channel cannot be full: it holds
// at most one response per type (the servers size it so) and this watch has at most one.
func (w *edsWatch) ticket() {
	if w.pending {
		return
	}
	w.pending = true
	r := &edsResponse{w: w}
	if w.sotw != nil {
		w.sotwOut <- r
		return
	}
	w.deltaOut <- r
}

// uncount removes name's entry of known from base, if base counts it.
func (w *edsWatch) uncount(name, v string) {
	if old, ok := w.st[name]; ok && old.version == v {
		w.base -= old.tag
	}
}

// onChange records the modified names w's client lacks in next, under the cache's lock, in
// O(len(modified)). A SotW client is simply no longer counted to hold a removed CLA.
func (w *edsWatch) onChange(next edsState, modified []string) {
	for _, name := range modified {
		if !w.interested(name) {
			continue
		}
		if _, ok := w.dirty[name]; ok {
			continue
		}
		r, exists := next[name]
		v, isKnown := w.known[name]
		switch {
		case exists && isKnown && v == r.version:
		case exists:
			w.mark(name)
		case !isKnown:
		case w.sotw != nil:
			w.uncount(name, v)
			delete(w.known, name)
		default:
			w.mark(name)
		}
	}
	if len(w.dirty) > 0 {
		w.ticket()
	}
}

// resolve turns w's pending changes into a response against the current state: it updates what
// the client is counted to hold, in place, and returns what to send.
func (w *edsWatch) resolve() (changed []*Resource, removed []string, version string) {
	c := w.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if w.cancelled {
		// A delta server may send a ticket queued just before it cancelled the watch, after
		// the next watch opened on the same map of known versions: that watch owes the change
		// now, so this ticket carries nothing.
		return nil, nil, strconv.FormatUint(w.base, 16)
	}
	st := *c.state.Load()
	for name := range w.dirty {
		v, isKnown := w.known[name]
		if isKnown {
			w.uncount(name, v)
		}
		r, exists := st[name]
		switch {
		case exists && w.interested(name):
			if !isKnown || v != r.version {
				changed = append(changed, r)
				w.known[name] = r.version
			}
			w.base += r.tag
		case isKnown:
			delete(w.known, name)
			removed = append(removed, name)
		}
	}
	w.dirty = nil // not cleared: the first response marks every resource, and a cleared map keeps its size
	w.pending = false
	w.st = st
	return changed, removed, strconv.FormatUint(w.base, 16)
}

// edsResponse is a ticket: the response a watch owes its client, resolved (against the state
// current then) when its stream first reads it, which is when the stream sends it.
type edsResponse struct {
	w       *edsWatch
	once    sync.Once
	changed []*Resource
	removed []string
	version string
}

var (
	_ cache.Response      = (*edsResponse)(nil)
	_ cache.DeltaResponse = (*edsResponse)(nil)
)

func (r *edsResponse) resolve() {
	r.once.Do(func() { r.changed, r.removed, r.version = r.w.resolve() })
}

// GetDiscoveryResponse returns a new DiscoveryResponse (the server sets its nonce) whose
// resources are shared, pre-marshalled Anys.
func (r *edsResponse) GetDiscoveryResponse() (*discoveryv3.DiscoveryResponse, error) {
	r.resolve()
	res := make([]*anypb.Any, len(r.changed))
	for i, c := range r.changed {
		res[i] = c.any
	}
	out := &discoveryv3.DiscoveryResponse{VersionInfo: r.version, Resources: res, TypeUrl: resource.EndpointType}
	return out, nil
}

// GetDeltaDiscoveryResponse returns a new DeltaDiscoveryResponse (the server sets its nonce)
// whose resources are shared.
func (r *edsResponse) GetDeltaDiscoveryResponse() (*discoveryv3.DeltaDiscoveryResponse, error) {
	r.resolve()
	res := make([]*discoveryv3.Resource, len(r.changed))
	for i, c := range r.changed {
		res[i] = c.delta
	}
	return &discoveryv3.DeltaDiscoveryResponse{
		SystemVersionInfo: r.version, Resources: res, RemovedResources: r.removed, TypeUrl: resource.EndpointType,
	}, nil
}

func (r *edsResponse) GetRequest() *discoveryv3.DiscoveryRequest           { return r.w.sotw }
func (r *edsResponse) GetDeltaRequest() *discoveryv3.DeltaDiscoveryRequest { return r.w.delta }

// GetVersion is the deprecated form of GetResponseVersion.
func (r *edsResponse) GetVersion() (string, error) { return r.GetResponseVersion(), nil }

// GetSystemVersion is the deprecated form of GetResponseVersion.
func (r *edsResponse) GetSystemVersion() (string, error) { return r.GetResponseVersion(), nil }

func (r *edsResponse) GetResponseVersion() string {
	r.resolve()
	return r.version
}

// GetReturnedResources is the watch's map of what the client holds (see edsWatch.known).
func (r *edsResponse) GetReturnedResources() map[string]string {
	r.resolve()
	return r.w.known
}

// GetNextVersionMap is the deprecated form of GetReturnedResources.
func (r *edsResponse) GetNextVersionMap() map[string]string { return r.GetReturnedResources() }

func (r *edsResponse) GetContext() context.Context { return context.Background() }

// Name is the resource's name (its cluster's).
func (r *Resource) Name() string { return r.name }

// Version is the resource's version, derived from its content and salt (see NewResource).
func (r *Resource) Version() string { return r.version }
