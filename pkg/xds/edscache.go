package xds

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/cespare/xxhash/v2"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// endpointCache is tether's EDS cache: one set of ClusterLoadAssignments shared by every node,
// served through go-control-plane's state-of-the-world and delta ADS servers (it implements
// cache.Cache behind the MuxCache). It replaces go-control-plane's LinearCache, which indexes
// every open watch under each resource name it subscribes to: with an Envoy subscribed to 1,000
// clusters, each push and each ACK removed and re-inserted 1,000 map entries per client, under
// one lock, so one endpoint change took seconds to reach a fleet of 1,000.
//
// Here a watch is registered once, in one map, in O(1). A change to a set M of resources
// visits every open watch and tests only the names in M against its subscription, under the
// lock; everything proportional to the size of a client's subscription (its map of returned
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
type endpointCache struct {
	state atomic.Pointer[edsState] // immutable; replaced by update

	mu      sync.Mutex // serializes update and guards watches
	watches map[uint64]*edsWatch
	nextID  uint64

	recentMu sync.Mutex
	recent   map[unsafe.Pointer]returnedMeta // returned-version maps of the current state, by identity
}

var _ cache.Cache = (*endpointCache)(nil)

// edsState is one immutable generation of the cache's resources, by name.
type edsState map[string]*edsResource

// edsResource is one resource at one version, marshalled once.
type edsResource struct {
	name    string
	version string
	tag     uint64                // versionTag(name, version)
	any     *anypb.Any            // shared by every SotW response
	delta   *discoveryv3.Resource // shared by every delta response
}

// newEDSResource marshals m (deterministically) and versions it: version is
// edsVersion(the wire form's hash, salt).
func newEDSResource(name string, m proto.Message, salt uint64) (*edsResource, uint64, error) {
	b, err := deterministic().Marshal(m)
	if err != nil {
		return nil, 0, fmt.Errorf("marshal %s: %w", name, err)
	}
	sum := xxhash.Sum64(b)
	v := edsVersion(sum, salt)
	a := &anypb.Any{TypeUrl: resource.EndpointType, Value: b}
	return &edsResource{
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

func newEndpointCache() *endpointCache {
	c := &endpointCache{watches: map[uint64]*edsWatch{}, recent: map[unsafe.Pointer]returnedMeta{}}
	c.state.Store(&edsState{})
	return c
}

// update sets the resources in set and deletes those named in del, then answers every open
// watch the change concerns.
func (c *endpointCache) update(set []*edsResource, del []string) {
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
	c.recentMu.Lock()
	clear(c.recent) // they describe older states
	c.recentMu.Unlock()
	for id, w := range c.watches {
		if resp := w.onChange(next, modified); resp != nil {
			delete(c.watches, id)
			w.send(resp)
		}
	}
}

// CreateWatch implements cache.ConfigWatcher for state-of-the-world streams.
func (c *endpointCache) CreateWatch(req *cache.Request, sub cache.Subscription, out chan cache.Response) (func(), error) {
	if req.GetTypeUrl() != resource.EndpointType {
		return nil, fmt.Errorf("xds: endpoint cache cannot serve %s", req.GetTypeUrl())
	}
	w := &edsWatch{c: c, sotw: req, sub: sub, sotwOut: out}
	return c.watch(w, func(st edsState) *edsResponse {
		if req.GetVersionInfo() != "" && c.upToDate(w, st) {
			return nil
		}
		known := sub.ReturnedResources()
		d := changes(st, sub, known)
		if len(d.changed) > 0 && len(known) == 0 && req.GetVersionInfo() != "" && req.GetResponseNonce() == "" {
			// A new stream from a client that holds a version: if the resources it subscribes
			// to give exactly that version, it holds them already.
			held := make(map[string]string, len(d.changed))
			for _, r := range d.changed {
				held[r.name] = r.version
			}
			if strconv.FormatUint(d.sum(), 16) == req.GetVersionInfo() {
				w.assumed, w.st, w.base = held, st, d.sum()
				return nil
			}
		}
		// The first request of a stream (no version) is always answered, even when empty.
		if len(d.changed) == 0 && req.GetVersionInfo() != "" {
			w.holds(st, known, d)
			return nil
		}
		return w.respond(st, known, d)
	})
}

// CreateDeltaWatch implements cache.ConfigWatcher for delta streams.
func (c *endpointCache) CreateDeltaWatch(req *cache.DeltaRequest, sub cache.Subscription, out chan cache.DeltaResponse) (func(), error) {
	if req.GetTypeUrl() != resource.EndpointType {
		return nil, fmt.Errorf("xds: endpoint cache cannot serve %s", req.GetTypeUrl())
	}
	w := &edsWatch{c: c, delta: req, sub: sub, deltaOut: out}
	// A wildcard subscription's first request is answered even when empty: Envoy waits for it
	// to finish initialising.
	first := sub.IsWildcard() && req.GetResponseNonce() == ""
	return c.watch(w, func(st edsState) *edsResponse {
		if !first && c.upToDate(w, st) {
			return nil
		}
		known := sub.ReturnedResources()
		d := changes(st, sub, known)
		if len(d.changed)+len(d.removed) == 0 && !first {
			w.holds(st, known, d)
			return nil
		}
		return w.respond(st, known, d)
	})
}

// upToDate is the fast path of an ACK: the subscription's known versions are the map of this
// cache's last response to it, unchanged since (no name was dropped from it), the state has not
// moved since that response, and the subscription names exactly its resources. Then the client
// holds every resource it subscribes to at its current version. It sets w's base.
func (c *endpointCache) upToDate(w *edsWatch, st edsState) bool {
	known := w.sub.ReturnedResources()
	if w.sub.IsWildcard() || len(known) == 0 || len(known) != len(w.sub.SubscribedResources()) {
		return false
	}
	key := mapPointer(known)
	c.recentMu.Lock()
	m, ok := c.recent[key]
	delete(c.recent, key)
	c.recentMu.Unlock()
	if !ok || m.n != len(known) || !sameState(m.st, st) {
		return false
	}
	w.st, w.base = st, m.sum
	return true
}

// watch answers w at once when answer, computed against the current state outside the lock,
// returns a response; otherwise it registers w, unless the state moved meanwhile (then it
// computes again).
func (c *endpointCache) watch(w *edsWatch, answer func(edsState) *edsResponse) (func(), error) {
	for {
		st := c.state.Load()
		if resp := answer(*st); resp != nil {
			w.send(resp)
			return nil, nil
		}
		c.mu.Lock()
		if c.state.Load() != st {
			c.mu.Unlock()
			w.assumed = nil
			continue
		}
		c.nextID++
		id := c.nextID
		c.watches[id] = w
		c.mu.Unlock()
		return func() {
			c.mu.Lock()
			delete(c.watches, id)
			c.mu.Unlock()
		}, nil
	}
}

// Fetch implements cache.ConfigFetcher; tether serves no REST xDS.
func (c *endpointCache) Fetch(context.Context, *cache.Request) (cache.Response, error) {
	return nil, errors.New("xds: the endpoint cache serves no fetch requests")
}

// diff is what a subscription lacks against a state: the resources to send (new to the client,
// or at another version), the names to drop (known but gone, or no longer subscribed), and held,
// the versionTag sum of the subscribed resources the client already holds at their current
// version.
type diff struct {
	changed []*edsResource
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

// edsWatch is one open request of one stream: state of the world (sotw set) or delta.
type edsWatch struct {
	c        *endpointCache
	sotw     *cache.Request
	delta    *cache.DeltaRequest
	sub      cache.Subscription
	sotwOut  chan cache.Response
	deltaOut chan cache.DeltaResponse
	// assumed, when set, is what a new SotW stream holds by its version_info (see
	// CreateWatch); the server has recorded nothing for it yet.
	assumed map[string]string
	// st is the state the watch was registered at, when the client held every resource it
	// subscribes to at its version in st; base is their versionTag sum.
	st   edsState
	base uint64
}

func (w *edsWatch) known() map[string]string {
	if w.assumed != nil {
		return w.assumed
	}
	return w.sub.ReturnedResources()
}

// onChange returns the response the change of the modified names to next owes w, or nil. It
// runs under the cache's lock and costs O(len(modified)): a registered watch was up to date
// with every resource it subscribes to when it was registered (w.st), and each later change
// that concerned it would have answered (and removed) it.
func (w *edsWatch) onChange(next edsState, modified []string) *edsResponse {
	known := w.known()
	wildcard := w.sub.IsWildcard()
	subscribed := w.sub.SubscribedResources()
	d := diff{held: w.base}
	for _, name := range modified {
		if !wildcard {
			if _, ok := subscribed[name]; !ok {
				continue
			}
		}
		r, exists := next[name]
		v, isKnown := known[name]
		if exists && isKnown && v == r.version {
			continue
		}
		if !exists && !isKnown {
			continue
		}
		if old, ok := w.st[name]; ok && isKnown && old.version == v {
			d.held -= old.tag // counted in base, at the version the client holds
		}
		if exists {
			d.changed = append(d.changed, r)
		} else {
			d.removed = append(d.removed, name)
		}
	}
	switch {
	case len(d.changed) > 0 || (w.delta != nil && len(d.removed) > 0):
		return w.respond(next, known, d)
	case len(d.removed) > 0:
		// State of the world cannot express the removal of a CLA: no answer, but the removed
		// CLAs leave what the client is counted to hold.
		w.holds(next, known, d)
	}
	return nil
}

// holds records that, at st, w's client holds every resource it subscribes to, except d's
// removals (d has no changes): w.base is their versionTag sum.
func (w *edsWatch) holds(st edsState, known map[string]string, d diff) {
	w.st, w.base = st, d.held
	if len(d.removed) > 0 {
		w.assumed = maps.Clone(known)
		for _, name := range d.removed {
			delete(w.assumed, name)
		}
	}
}

func (w *edsWatch) respond(st edsState, known map[string]string, d diff) *edsResponse {
	return &edsResponse{w: w, st: st, known: known, changed: d.changed, removed: d.removed, version: strconv.FormatUint(d.sum(), 16), sum: d.sum()}
}

func (w *edsWatch) send(r *edsResponse) {
	if w.sotw != nil {
		w.sotwOut <- r
		return
	}
	w.deltaOut <- r
}

// maxRecent bounds endpointCache.recent between two updates (streams that close before they
// acknowledge leave their entry until the next update).
const maxRecent = 1 << 16

// returnedMeta describes a map of returned versions this cache built (see upToDate).
type returnedMeta struct {
	st  edsState
	n   int
	sum uint64
}

func mapPointer(m map[string]string) unsafe.Pointer { return reflect.ValueOf(m).UnsafePointer() }

func sameState(a, b edsState) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

// edsResponse is one answer to a watch. The map of versions the client holds afterwards is
// built on first use, by the stream that sends it.
type edsResponse struct {
	w       *edsWatch
	st      edsState
	known   map[string]string
	changed []*edsResource
	removed []string
	version string
	sum     uint64

	once     sync.Once
	returned map[string]string
}

var (
	_ cache.Response      = (*edsResponse)(nil)
	_ cache.DeltaResponse = (*edsResponse)(nil)
)

// GetDiscoveryResponse returns a new DiscoveryResponse (the server sets its nonce) whose
// resources are shared, pre-marshalled Anys.
func (r *edsResponse) GetDiscoveryResponse() (*discoveryv3.DiscoveryResponse, error) {
	res := make([]*anypb.Any, len(r.changed))
	for i, c := range r.changed {
		res[i] = c.any
	}
	return &discoveryv3.DiscoveryResponse{VersionInfo: r.version, Resources: res, TypeUrl: resource.EndpointType}, nil
}

// GetDeltaDiscoveryResponse returns a new DeltaDiscoveryResponse (the server sets its nonce)
// whose resources are shared.
func (r *edsResponse) GetDeltaDiscoveryResponse() (*discoveryv3.DeltaDiscoveryResponse, error) {
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
func (r *edsResponse) GetVersion() (string, error) { return r.version, nil }

// GetSystemVersion is the deprecated form of GetResponseVersion.
func (r *edsResponse) GetSystemVersion() (string, error) { return r.version, nil }

func (r *edsResponse) GetResponseVersion() string { return r.version }

// GetReturnedResources is the versions the client holds once it has this response: a map of its
// own (the servers edit the map they keep), remembered for upToDate.
func (r *edsResponse) GetReturnedResources() map[string]string {
	r.once.Do(func() {
		if r.known == nil {
			r.returned = make(map[string]string, len(r.changed))
		} else {
			r.returned = maps.Clone(r.known)
		}
		for _, name := range r.removed {
			delete(r.returned, name)
		}
		for _, res := range r.changed {
			r.returned[res.name] = res.version
		}
		c := r.w.c
		c.recentMu.Lock()
		if len(c.recent) >= maxRecent {
			clear(c.recent)
		}
		if sameState(*c.state.Load(), r.st) {
			c.recent[mapPointer(r.returned)] = returnedMeta{st: r.st, n: len(r.returned), sum: r.sum}
		}
		c.recentMu.Unlock()
	})
	return r.returned
}

// GetNextVersionMap is the deprecated form of GetReturnedResources.
func (r *edsResponse) GetNextVersionMap() map[string]string { return r.GetReturnedResources() }

func (r *edsResponse) GetContext() context.Context { return context.Background() }
