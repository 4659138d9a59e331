package status

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// Webhook headers. The signature is hex(HMAC-SHA256(secret, timestamp + "." + body)) with the
// timestamp header's value, so a receiver can refuse replays of old deliveries.
const (
	HeaderSignature = "X-Tether-Signature" // "sha256=<hex>"
	HeaderTimestamp = "X-Tether-Timestamp" // Unix seconds
	HeaderEvent     = "X-Tether-Event"     // scale-out or scale-in
	HeaderDelivery  = "X-Tether-Delivery"  // random id, the same on every retry of one event
)

// WebhookBody is the JSON body of one delivery.
type WebhookBody struct {
	Kind     string    `json:"kind"`
	Service  string    `json:"service"`
	Instance string    `json:"instance"`
	Desired  int       `json:"desiredInstances"`
	Time     time.Time `json:"time"`
}

// Sign returns the signature header value of body at timestamp ts under secret.
func Sign(secret []byte, ts string, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// Verify reports whether sig is the signature of body at ts under secret (constant time).
func Verify(secret []byte, ts string, body []byte, sig string) bool {
	return hmac.Equal([]byte(Sign(secret, ts, body)), []byte(sig))
}

// Webhook delivers events to a URL: POST, JSON, signed, retried with exponential backoff on
// transport errors, 5xx and 429 (other 4xx answers are final). Events queue in a bounded
// buffer (QueueSize); when it is full the newest event is dropped and counted (Dropped) —
// autoscaling signals are level-triggered (the desired-instances gauge carries the state), so
// a lost edge does not lose the state.
type Webhook struct {
	url      string
	secret   []byte
	client   *http.Client
	attempts int
	backoff  time.Duration
	maxWait  time.Duration
	log      *slog.Logger
	queue    chan Event

	delivered, failed, dropped atomic.Uint64
}

// QueueSize bounds the events waiting for delivery.
const QueueSize = 256

// WebhookOption configures a Webhook.
type WebhookOption func(*Webhook)

// WithRetries sets the attempts per event (default 6) and the first and largest pause between
// attempts (default 1s and 30s; each pause doubles).
func WithRetries(attempts int, first, largest time.Duration) WebhookOption {
	return func(w *Webhook) { w.attempts, w.backoff, w.maxWait = attempts, first, largest }
}

// WithWebhookClient sets the HTTP client (default: 10 s timeout).
// Its CheckRedirect is replaced: the webhook follows no redirects.
func WithWebhookClient(c *http.Client) WebhookOption { return func(w *Webhook) { w.client = c } }

// WithWebhookLogger sets the logger (default: discard).
func WithWebhookLogger(l *slog.Logger) WebhookOption { return func(w *Webhook) { w.log = l } }

// NewWebhook returns a sender to url signing with secret. Call Run to deliver and Enqueue (or
// subscribe it to Events) to send.
func NewWebhook(url string, secret []byte, opts ...WebhookOption) *Webhook {
	w := &Webhook{url: url, secret: secret, client: &http.Client{Timeout: 10 * time.Second},
		attempts: 6, backoff: time.Second, maxWait: 30 * time.Second,
		log: slog.New(slog.DiscardHandler), queue: make(chan Event, QueueSize)}
	for _, o := range opts {
		o(w)
	}
	// A redirect is never followed: following it would re-send the signed body (and its
	// signature) to wherever the answer points. A 3xx is a failed delivery, not retried.
	c := *w.client
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	w.client = &c
	return w
}

// Enqueue queues ev for delivery without blocking.
func (w *Webhook) Enqueue(ev Event) {
	select {
	case w.queue <- ev:
	default:
		w.dropped.Add(1)
		w.log.Warn("webhook: queue full; event dropped", "kind", ev.Kind, "service", ev.Service, "instance", ev.Instance)
	}
}

// WebhookStats counts deliveries.
type WebhookStats struct{ Delivered, Failed, Dropped uint64 }

// Stats returns the delivery counters.
func (w *Webhook) Stats() WebhookStats {
	return WebhookStats{Delivered: w.delivered.Load(), Failed: w.failed.Load(), Dropped: w.dropped.Load()}
}

// Run delivers queued events one at a time until ctx ends.
func (w *Webhook) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-w.queue:
			if err := w.deliver(ctx, ev); err != nil {
				w.failed.Add(1)
				w.log.Error("webhook: delivery failed", "kind", ev.Kind, "service", ev.Service, "instance", ev.Instance, "err", err)
			} else {
				w.delivered.Add(1)
			}
		}
	}
}

func (w *Webhook) deliver(ctx context.Context, ev Event) error {
	body, err := json.Marshal(WebhookBody{Kind: ev.Kind, Service: ev.Service, Instance: ev.Instance, Desired: ev.Desired, Time: ev.Time.UTC()})
	if err != nil {
		return err
	}
	var id [12]byte
	_, _ = rand.Read(id[:]) // crypto/rand.Read never fails
	delivery := hex.EncodeToString(id[:])
	pause := w.backoff
	var last error
	for attempt := 1; attempt <= w.attempts; attempt++ {
		retry, err := w.post(ctx, ev.Kind, delivery, body)
		if err == nil {
			return nil
		}
		last = fmt.Errorf("attempt %d: %w", attempt, err)
		if !retry || attempt == w.attempts {
			break
		}
		w.log.Warn("webhook: delivery failed; retrying", "kind", ev.Kind, "attempt", attempt, "in", pause, "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pause):
		}
		pause = min(2*pause, w.maxWait)
	}
	return last
}

// post sends one attempt; retry says whether a failure is worth another.
func (w *Webhook) post(ctx context.Context, kind, delivery string, body []byte) (retry bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, bytes.NewReader(body))
	if err != nil {
		return false, err
	}
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "tether-webhook")
	req.Header.Set(HeaderTimestamp, ts)
	req.Header.Set(HeaderSignature, Sign(w.secret, ts, body))
	req.Header.Set(HeaderEvent, kind)
	req.Header.Set(HeaderDelivery, delivery)
	resp, err := w.client.Do(req)
	if err != nil {
		return ctx.Err() == nil, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	switch {
	case resp.StatusCode < 300:
		return false, nil
	case resp.StatusCode >= 500, resp.StatusCode == http.StatusTooManyRequests:
		return true, fmt.Errorf("HTTP %d", resp.StatusCode)
	default:
		return false, fmt.Errorf("HTTP %d (not retried)", resp.StatusCode)
	}
}
