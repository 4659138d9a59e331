package xds

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"

	"github.com/cespare/xxhash/v2"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/anypb"
)

// sotwCache serves clusters, listeners and routes to state-of-the-world streams, one set per
// snapshot key, each resource marshalled once per version into an Any that every response
// shares (go-control-plane's SnapshotCache marshals every resource again for every response:
// with 1,000 clusters, connecting 1,000 Envoys marshalled a million clusters). A wildcard
// subscription's response is the same slice for every client of the key. Delta streams keep
// go-control-plane's SnapshotCaches, which the publisher feeds the same snapshots.
//
// Semantics follow go-control-plane's SnapshotCache (a stream's first request of a type is
// answered; later ones when the client lacks something; a NACK, which carries the version
// before the rejected one, is answered with the current configuration again), except that what
// a client holds is its version_info, never a map: a wildcard response's version is the type's
// ContentVersion, a named subscription's a hash of that version and the names it receives
// (namedVersion), so a client asking with the version it holds gets no response and a client
// whose subscription changed gets one. Responses carry no returned-resources map (the server
// would keep a copy of every name per client).
//
// For keys of Envoy nodes (ADS), a named request is answered only once every name it lists
// exists, as go-control-plane's ADS SnapshotCache does. A watch is answered at most once; the
// server opens a new one with the client's next request. Safe for concurrent use.
type sotwCache struct {
	key func(*corev3.Node) string
	ads func(key string) bool

	mu      sync.Mutex
	states  map[string]map[resource.Type]*sotwResources // by snapshot key
	watches map[sotwWatchKey]map[uint64]*sotwWatch
	nextID  uint64
}

var _ cache.Cache = (*sotwCache)(nil)

type sotwWatchKey struct {
	key string
	typ resource.Type
}

// sotwResources is one type's resources of one snapshot key at one version, immutable.
type sotwResources struct {
	version string
	anys    []*anypb.Any // sorted by name; shared by every wildcard response
	byName  map[string]int
}

type sotwWatch struct {
	req *cache.Request
	sub cache.Subscription
	out chan cache.Response
}

func newSOTWCache(key func(*corev3.Node) string, ads func(string) bool) *sotwCache {
	return &sotwCache{key: key, ads: ads, states: map[string]map[resource.Type]*sotwResources{}, watches: map[sotwWatchKey]map[uint64]*sotwWatch{}}
}

// newSOTWResources wraps sorted items, whose wire forms are set, at version.
func newSOTWResources(typ resource.Type, items []item, version string) *sotwResources {
	r := &sotwResources{version: version, anys: make([]*anypb.Any, len(items)), byName: make(map[string]int, len(items))}
	for i, it := range items {
		r.anys[i] = &anypb.Any{TypeUrl: typ, Value: it.wire}
		r.byName[it.name] = i
	}
	return r
}

// set replaces key's resources of the types in res and answers the open watches whose clients
// lack the new content.
func (c *sotwCache) set(key string, res map[resource.Type]*sotwResources) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.states[key]
	if st == nil {
		st = map[resource.Type]*sotwResources{}
		c.states[key] = st
	}
	for _, typ := range []resource.Type{resource.ClusterType, resource.ListenerType, resource.RouteType} {
		r, ok := res[typ]
		if !ok {
			continue
		}
		st[typ] = r
		wk := sotwWatchKey{key, typ}
		for id, w := range c.watches[wk] {
			if c.answer(key, w, r) {
				delete(c.watches[wk], id)
			}
		}
	}
}

// CreateWatch implements cache.ConfigWatcher for state-of-the-world streams.
func (c *sotwCache) CreateWatch(req *cache.Request, sub cache.Subscription, out chan cache.Response) (func(), error) {
	typ := req.GetTypeUrl() // a type tether does not serve is never answered, as in a SnapshotCache
	key := c.key(req.GetNode())
	w := &sotwWatch{req: req, sub: sub, out: out}
	c.mu.Lock()
	defer c.mu.Unlock()
	if r := c.states[key][typ]; r != nil && c.answer(key, w, r) {
		return func() {}, nil
	}
	wk := sotwWatchKey{key, typ}
	if c.watches[wk] == nil {
		c.watches[wk] = map[uint64]*sotwWatch{}
	}
	c.nextID++
	id := c.nextID
	c.watches[wk][id] = w
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.watches[wk], id)
	}, nil
}

// CreateDeltaWatch is not served here (delta streams use go-control-plane's SnapshotCaches).
func (c *sotwCache) CreateDeltaWatch(*cache.DeltaRequest, cache.Subscription, chan cache.DeltaResponse) (func(), error) {
	return nil, errors.New("xds: the state-of-the-world snapshot cache serves no delta streams")
}

// answer queues w's response from r unless w's client already holds it on this stream (or, for
// an ADS key, r lacks a name w subscribes to), and reports whether it did. Called with c.mu
// held.
func (c *sotwCache) answer(key string, w *sotwWatch, r *sotwResources) bool {
	resp := &sotwResponse{req: w.req}
	if w.sub.IsWildcard() {
		resp.version, resp.anys = r.version, r.anys
	} else {
		idx := make([]int, 0, len(w.sub.SubscribedResources()))
		for name := range w.sub.SubscribedResources() {
			i, ok := r.byName[name]
			if !ok {
				if c.ads(key) {
					return false
				}
				continue
			}
			idx = append(idx, i)
		}
		slices.Sort(idx)
		resp.anys = make([]*anypb.Any, len(idx))
		for j, i := range idx {
			resp.anys[j] = r.anys[i]
		}
		resp.version = namedVersion(r, idx)
	}
	if resp.version == w.req.GetVersionInfo() && w.req.GetResponseNonce() != "" {
		return false
	}
	// The channel holds one response per type and this watch sends at most one.
	w.out <- resp
	return true
}

// namedVersion is the version_info of a named subscription receiving r's resources at idx
// (sorted): r's version when they are all of r, otherwise a hash of r's version and their names.
func namedVersion(r *sotwResources, idx []int) string {
	if len(idx) == len(r.anys) {
		return r.version
	}
	d := xxhash.New()
	_, _ = d.WriteString(r.version)
	for _, i := range idx {
		_, _ = d.Write([]byte{0})
		_, _ = d.WriteString(strconv.Itoa(i))
	}
	return r.version + "-" + strconv.FormatUint(d.Sum64(), 16)
}

// Fetch implements cache.ConfigFetcher; tether serves no REST xDS.
func (c *sotwCache) Fetch(context.Context, *cache.Request) (cache.Response, error) {
	return nil, errors.New("xds: the snapshot cache serves no fetch requests")
}

// sotwResponse is one state-of-the-world response; its resources are shared.
type sotwResponse struct {
	req     *cache.Request
	version string
	anys    []*anypb.Any
}

var _ cache.Response = (*sotwResponse)(nil)

// GetDiscoveryResponse returns a new DiscoveryResponse (the server sets its nonce) whose
// resources are shared, pre-marshalled Anys; nothing may modify them.
func (r *sotwResponse) GetDiscoveryResponse() (*discoveryv3.DiscoveryResponse, error) {
	return &discoveryv3.DiscoveryResponse{VersionInfo: r.version, Resources: r.anys, TypeUrl: r.req.GetTypeUrl()}, nil
}

func (r *sotwResponse) GetRequest() *discoveryv3.DiscoveryRequest { return r.req }

// GetVersion is the deprecated form of GetResponseVersion.
func (r *sotwResponse) GetVersion() (string, error) { return r.version, nil }

func (r *sotwResponse) GetResponseVersion() string { return r.version }

// GetReturnedResources is nil: the version_info says what the client holds (see sotwCache).
func (r *sotwResponse) GetReturnedResources() map[string]string { return nil }

func (r *sotwResponse) GetContext() context.Context { return context.Background() }
