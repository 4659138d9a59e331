package sipdecide

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/calls"
	"github.com/tether-dev/tether/pkg/wire"
)

// WithCalls makes the endpoint count calls per instance in tr (Kamailio's call-load
// dispatcher, done by tether) for the services tr tracks (calls.Tracker.Tracked): a decided
// initial INVITE begins a call on its instance — or is
// refused, 503 CallCapReached with Retry-After, when the instance is at the service's call cap
// — and the proxy reports each call answered and ended on the call endpoints (see
// ServeHTTP). Without WithCalls those endpoints answer 404.
func WithCalls(tr *calls.Tracker) Option { return func(h *Handler) { h.calls = tr } }

// Call-load endpoints, under PathPrefix + "{service}/":
//
//	POST calls/answered   body: the Call-ID (text/plain) — a 2xx answered the initial INVITE
//	POST calls/ended      body: the Call-ID — BYE, CANCEL or a negative final reply
//	GET  calls            the service's call load per instance (JSON)
//
// The POSTs answer 204, or 404 CallNotFound for a Call-ID tether does not track (never
// decided here, already ended or expired): the proxy may report twice.
const (
	callsAnswered = "calls/answered"
	callsEnded    = "calls/ended"
	callsList     = "calls"
)

// callPath parses "/v1/sip/{service}/calls", ".../calls/answered", ".../calls/ended" and
// ".../failover".
func callPath(p string) (service, action string, ok bool) {
	rest, ok := strings.CutPrefix(p, PathPrefix)
	if !ok {
		return "", "", false
	}
	service, action, ok = strings.Cut(rest, "/")
	if !ok || service == "" {
		return "", "", false
	}
	switch action {
	case callsList, callsAnswered, callsEnded, failoverAction:
		return service, action, true
	}
	return "", "", false
}

// callRetryAfter is the retry hint of a call refused at the cap.
const callRetryAfter = time.Second

// serveCalls answers the call-load endpoints (action is the path after the service).
func (h *Handler) serveCalls(w http.ResponseWriter, r *http.Request, service, action string) {
	if h.calls == nil || !h.calls.Tracked(service) {
		h.fail(w, http.StatusNotFound, "NotFound", "call load is not enabled for service "+service+" (calls.track)", 0)
		return
	}
	if action == callsList {
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			h.fail(w, http.StatusMethodNotAllowed, "MethodNotAllowed", "use GET", 0)
			return
		}
		loads := h.calls.Loads(service)
		if loads == nil {
			loads = []calls.Load{}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(struct {
			Service   string       `json:"service"`
			Instances []calls.Load `json:"instances"`
		}{service, loads})
		return
	}
	callID, ok := h.postedText(w, r)
	if !ok {
		return
	}
	if callID == "" {
		h.fail(w, http.StatusBadRequest, "MissingCallID", "the body must be the call's Call-ID", 0)
		return
	}
	var (
		c   calls.Call
		err error
	)
	if action == callsAnswered {
		c, err = h.calls.Answered(service, callID)
	} else {
		c, err = h.calls.Ended(service, callID)
	}
	if errors.Is(err, calls.ErrUnknownCall) {
		h.fail(w, http.StatusNotFound, "CallNotFound", err.Error(), 0)
		return
	}
	if err != nil {
		h.fail(w, http.StatusInternalServerError, wire.InternalCode, err.Error(), 0)
		return
	}
	h.log.Debug("sipdecide: call "+strings.TrimPrefix(action, "calls/"), "service", service, "call", callID, "instance", c.Instance)
	w.WriteHeader(http.StatusNoContent)
}

// WithTrustedSources exempts SIP clients in these networks (a trunk, an SBC of your own) from
// the per-source limit on calls in setup.
func WithTrustedSources(p []netip.Prefix) Option { return func(h *Handler) { h.trusted = p } }

// sourceOf is the call-source key of a SIP client "ip:port" ("" for a trusted one).
func (h *Handler) sourceOf(peer string) string {
	if ap, err := netip.ParseAddrPort(peer); err == nil {
		for _, p := range h.trusted {
			if p.Contains(ap.Addr().Unmap()) {
				return ""
			}
		}
	}
	return affinity.ClientBucket(peer)
}

// postedText reads the trimmed text body of a POST to a call-load or failover endpoint; it
// answers 405 or 400 and returns false when the request is not one.
func (h *Handler) postedText(w http.ResponseWriter, r *http.Request) (string, bool) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		h.fail(w, http.StatusMethodNotAllowed, "MethodNotAllowed", "use POST", 0)
		return "", false
	}
	body, err := readBody(r.Body)
	if err != nil {
		h.fail(w, http.StatusBadRequest, "BadBody", err.Error(), 0)
		return "", false
	}
	defer putBody(body)
	return strings.TrimSpace(string(*body)), true
}

// beginCall counts a decided initial INVITE on instance; it answers the refusal and returns
// false when the call cannot be taken. Requests other than INVITE, and INVITEs without a
// Call-ID, are not calls to count.
//
// The call is counted against its source — the SIP client's address the proxy reports in
// wire.SIPSourceHeader, bucketed as affinity.ClientBucket does (IPv4 address, IPv6 /64; requests
// without one share a bucket) unless it is in WithTrustedSources — so one source holds at most
// the service's calls.Limits.SourceSetup unanswered calls (503 SourceCallLimit over it).
func (h *Handler) beginCall(w http.ResponseWriter, service, instance, method, callID, peer string) bool {
	if h.calls == nil || method != "INVITE" || callID == "" || !h.calls.Tracked(service) {
		return true
	}
	if _, err := h.calls.BeginFrom(service, instance, callID, h.sourceOf(peer)); err != nil {
		code := "CallCapReached"
		switch {
		case errors.Is(err, calls.ErrTooManyCalls):
			code = "TooManyCalls"
		case errors.Is(err, calls.ErrSourceLimit):
			code = "SourceCallLimit"
		}
		h.log.Info("sipdecide: call refused", "service", service, "instance", instance, "call", callID, "err", err)
		h.fail(w, http.StatusServiceUnavailable, code, err.Error(), callRetryAfter)
		return false
	}
	return true
}
