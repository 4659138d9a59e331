// Package redissub keeps one Redis pub/sub subscription standing across connection failures.
// The session store's end notifications and the shared registry's change messages both ride
// on it.
package redissub

import (
	"context"
	"time"

	"github.com/redis/rueidis"
)

// Retry is how long Follow waits before subscribing again after the subscription broke.
const Retry = 100 * time.Millisecond

// Hooks are what Follow reports. They run on the client's connection goroutines (Failed on
// Follow's): they must be quick. Nil hooks are skipped.
type Hooks struct {
	// Message is one message published on the channel.
	Message func(rueidis.PubSubMessage)
	// Subscribed is called each time the subscription stands, the first time and after
	// every reconnection: what was published while none stood was missed.
	Subscribed func()
	// Failed is called when subscribing failed or a standing subscription broke.
	Failed func(error)
}

// Follow subscribes to channel on a dedicated connection of c and keeps the subscription
// standing until ctx ends, subscribing again Retry after each failure. It returns when ctx
// ends.
func Follow(ctx context.Context, c rueidis.Client, channel string, h Hooks) {
	for ctx.Err() == nil {
		dc, release := c.Dedicate()
		wait := dc.SetPubSubHooks(rueidis.PubSubHooks{
			OnMessage: func(m rueidis.PubSubMessage) {
				if h.Message != nil {
					h.Message(m)
				}
			},
			OnSubscription: func(s rueidis.PubSubSubscription) {
				if s.Kind == "subscribe" && h.Subscribed != nil {
					h.Subscribed()
				}
			},
		})
		err := dc.Do(ctx, dc.B().Subscribe().Channel(channel).Build()).Error()
		if err == nil {
			select {
			case <-ctx.Done():
			case err = <-wait:
			}
		}
		release()
		if ctx.Err() != nil {
			return
		}
		if err != nil && h.Failed != nil {
			h.Failed(err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(Retry):
		}
	}
}
