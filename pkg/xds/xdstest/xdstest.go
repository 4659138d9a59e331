// Package xdstest provides real xDS clients for tests of anything fed by tether's ADS server:
// Watcher, a state-of-the-world ADS subscription built on go-control-plane's own ADS client
// (pkg/client/sotw/v3), which keeps the resources it has accepted and ACKs (or NACKs) each
// response like Envoy does.
package xdstest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	sotwclient "github.com/envoyproxy/go-control-plane/pkg/client/sotw/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Update is the state a Watcher holds after a response.
type Update struct {
	// Resources are the accepted resources by name. For CDS and LDS every response is the full
	// state; for EDS and RDS a response carries only changed resources and the Watcher merges it
	// into what it had. The map and its protos must not be modified.
	Resources map[string]proto.Message
	// Last holds only the resources of the last accepted response.
	Last map[string]proto.Message
	// Responses counts every response received on the stream (ACKed or NACKed).
	Responses int
	// At is when the last response arrived.
	At time.Time
}

// Option configures a Watcher.
type Option func(*Watcher)

// WithNack makes the Watcher reject a response when reject returns a non-empty message (sent
// as error_detail, as Envoy does); the resources of a rejected response are not applied.
func WithNack(reject func(resources map[string]proto.Message) string) Option {
	return func(w *Watcher) { w.reject = reject }
}

// Watcher is one ADS stream subscribed (wildcard) to one resource type. Safe for concurrent use.
type Watcher struct {
	typeURL string
	reject  func(map[string]proto.Message) string

	mu      sync.Mutex
	state   Update
	err     error
	changed chan struct{} // closed and replaced on every response or error
	done    chan struct{}
	cancel  context.CancelFunc
}

// Watch opens an ADS stream on conn for node and typeURL and starts applying responses in the
// background until ctx ends or Close is called.
func Watch(ctx context.Context, conn grpc.ClientConnInterface, node *corev3.Node, typeURL string, opts ...Option) (*Watcher, error) {
	ctx, cancel := context.WithCancel(ctx)
	w := &Watcher{
		typeURL: typeURL,
		state:   Update{Resources: map[string]proto.Message{}},
		changed: make(chan struct{}),
		done:    make(chan struct{}),
		cancel:  cancel,
	}
	for _, o := range opts {
		o(w)
	}
	c := sotwclient.NewADSClient(ctx, node, typeURL)
	if err := c.InitConnect(conn); err != nil {
		cancel()
		return nil, fmt.Errorf("xdstest: connect: %w", err)
	}
	go w.loop(c)
	return w, nil
}

func (w *Watcher) loop(c sotwclient.ADSClient) {
	defer close(w.done)
	fullState := w.typeURL == resource.ClusterType || w.typeURL == resource.ListenerType
	for {
		resp, err := c.Fetch()
		if err != nil {
			w.fail(err)
			return
		}
		got := make(map[string]proto.Message, len(resp.Resources))
		for _, a := range resp.Resources {
			m, err := a.UnmarshalNew()
			if err != nil {
				w.fail(fmt.Errorf("xdstest: unpack %s: %w", a.GetTypeUrl(), err))
				return
			}
			got[cache.GetResourceName(m)] = m
		}
		if w.reject != nil {
			if msg := w.reject(got); msg != "" {
				w.apply(nil, fullState, false)
				if err := c.Nack(msg); err != nil {
					w.fail(err)
					return
				}
				continue
			}
		}
		w.apply(got, fullState, true)
		if err := c.Ack(); err != nil {
			w.fail(err)
			return
		}
	}
}

func (w *Watcher) apply(got map[string]proto.Message, fullState, accept bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	next := Update{Responses: w.state.Responses + 1, At: time.Now(), Resources: w.state.Resources, Last: w.state.Last}
	if accept {
		next.Last = got
		if fullState {
			next.Resources = got
		} else {
			next.Resources = maps.Clone(w.state.Resources)
			maps.Copy(next.Resources, got)
		}
	}
	w.state = next
	close(w.changed)
	w.changed = make(chan struct{})
}

func (w *Watcher) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.err = err
	close(w.changed)
	w.changed = make(chan struct{})
}

// Current returns the latest state.
func (w *Watcher) Current() Update {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.state
}

// Wait blocks until cond holds for the current state, the stream fails, or ctx ends.
func (w *Watcher) Wait(ctx context.Context, cond func(Update) bool) (Update, error) {
	for {
		w.mu.Lock()
		st, err, ch := w.state, w.err, w.changed
		w.mu.Unlock()
		if cond(st) {
			return st, nil
		}
		if err != nil {
			return st, err
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return st, fmt.Errorf("xdstest: %s: condition not met: %w", w.typeURL, ctx.Err())
		}
	}
}

// WaitResponses waits until at least n responses have arrived.
func (w *Watcher) WaitResponses(ctx context.Context, n int) (Update, error) {
	return w.Wait(ctx, func(u Update) bool { return u.Responses >= n })
}

// Quiet reports whether no response arrived during d.
func (w *Watcher) Quiet(ctx context.Context, d time.Duration) bool {
	before := w.Current().Responses
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	_, err := w.WaitResponses(ctx, before+1)
	return errors.Is(err, context.DeadlineExceeded)
}

// Close ends the stream and waits for the background loop.
func (w *Watcher) Close() {
	w.cancel()
	<-w.done
}
