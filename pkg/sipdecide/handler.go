package sipdecide

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/calls"
	"github.com/tether-dev/tether/pkg/dcr"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/wire"
)

// Decider decides where a request goes; *affinity.Engine implements it. The handler hands
// over a raw request as req.SIPMessage and, parsed once, as req.SIP; both are reused by the
// handler for later requests and valid only until Decide returns (strings read from req.SIP
// stay valid).
type Decider interface {
	Decide(ctx context.Context, req affinity.Request) (affinity.Decision, error)
}

// Paths and headers of the decision endpoint.
const (
	// PathPrefix starts every decision path: POST /v1/sip/{service}/decide, or POST
	// /v1/sip/decide with the service in wire.SIPServiceHeader.
	PathPrefix = "/v1/sip/"
	// MaxMessageSize is the largest SIP message accepted in a body, in bytes (the SIP parser's
	// own limit; a UDP datagram is smaller still).
	MaxMessageSize = 65535
)

// Option configures a Handler.
type Option func(*Handler)

// WithLogger sets the logger for rejected and failed decisions; the default discards.
func WithLogger(l *slog.Logger) Option {
	return func(h *Handler) {
		if l != nil {
			h.log = l
		}
	}
}

// WithTransport makes the answered SIP URI carry ";transport=<t>" (e.g. "tcp"); "" (default)
// leaves the transport to the proxy.
func WithTransport(t string) Option { return func(h *Handler) { h.transport = t } }

// Handler is the HTTP decision endpoint a SIP proxy (Kamailio) calls for each initial SIP
// request. It is safe for concurrent use.
//
// Request (POST, service from the path /v1/sip/{service}/decide or from X-Tether-Service on
// /v1/sip/decide), one of:
//   - body: the raw SIP request (Kamailio's $mb), any content type;
//   - selected fields, with an empty body: query parameters method, ruri, from, to, callid and
//     optionally pai (P-Asserted-Identity) and psu (P-Served-User), URL-encoded; the engine
//     rebuilds a SIP request from them.
//
// Optional X-Tether-Source: the client's "ip:port".
//
// Answers:
//   - 200 text/plain: the chosen instance's SIP URI, e.g. "sip:10.0.0.1:5070" (IPv6 in
//     brackets), with X-Tether-Instance: <id>;
//   - 400 the message cannot be parsed or lacks a key, 404 unknown service, 405 not POST,
//     413 message over MaxMessageSize, 429/503 no capacity (with Retry-After in seconds),
//     500 internal error; an application/json body wire.ErrorBody {"errorCode": "<code>",
//     "errorMessage": "..."}, the code in the same field as on ext_proc and the SessionAPI
//     (Kamailio acts on the status; the body is for its log).
//
// A SIP decision holds no request slot beyond the answer: SIP calls are long-lived and their
// in-dialog requests never come back here, so the Decision's End is called as soon as the
// answer is written.
type Handler struct {
	d         Decider
	log       *slog.Logger
	transport string
	calls     *calls.Tracker
	trusted   []netip.Prefix // SIP sources not limited per source (WithTrustedSources)
	answers   answerCache
}

// NewHandler returns the decision endpoint over d.
func NewHandler(d Decider, opts ...Option) *Handler {
	h := &Handler{d: d, log: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(h)
	}
	return h
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if service, action, ok := callPath(r.URL.Path); ok {
		if action == failoverAction {
			h.serveFailover(w, r, service)
		} else {
			h.serveCalls(w, r, service, action)
		}
		return
	}
	service, ok := h.decideService(w, r)
	if !ok {
		return
	}
	req := affinity.Request{
		Service:  service,
		Protocol: affinity.ProtocolSIP,
		Peer:     r.Header.Get(wire.SIPSourceHeader),
	}
	buf, err := readBody(r.Body)
	if err != nil {
		if errors.Is(err, errTooLarge) {
			h.fail(w, http.StatusRequestEntityTooLarge, "MessageTooLarge", err.Error(), 0)
			return
		}
		h.fail(w, http.StatusBadRequest, "BadBody", err.Error(), 0)
		return
	}
	// The body buffer goes back to the pool when the answer is written: the parsed message
	// holds its own copy, and neither the engine nor the call tracker keeps the raw bytes.
	defer putBody(buf)
	release, ok := h.readRequest(w, r, &req, *buf)
	if !ok {
		return
	}
	defer release() // after the answer: the call tracker keeps only its strings

	d, inst, ok := h.decide(w, r, req)
	if !ok {
		return
	}
	defer d.End()
	if h.calls != nil {
		method, callID := req.Method, req.Header("call-id")
		if req.SIP != nil {
			method, callID = req.SIP.Method(), req.SIP.CallID()
		}
		if !h.beginCall(w, service, inst.ID, method, callID, req.Peer) {
			return
		}
	}
	h.writeURI(w, inst, tokenSuffix(r, d))
}

// decideService returns the service a decide request names, in its path or else in the
// service header; it answers the request itself (and returns false) when it names none, is
// not a decide endpoint, or is not a POST.
func (h *Handler) decideService(w http.ResponseWriter, r *http.Request) (string, bool) {
	service, ok := serviceFromPath(r.URL.Path)
	if !ok {
		h.fail(w, http.StatusNotFound, "NotFound", "no such endpoint; POST /v1/sip/{service}/decide", 0)
		return "", false
	}
	if service == "" {
		service = r.Header.Get(wire.SIPServiceHeader)
		if service == "" {
			h.fail(w, http.StatusNotFound, "ServiceNotFound", "name the service in the path or in "+wire.SIPServiceHeader, 0)
			return "", false
		}
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		h.fail(w, http.StatusMethodNotAllowed, "MethodNotAllowed", "use POST", 0)
		return "", false
	}
	return service, true
}

// readRequest fills req from the body (a SIP request) or, for an empty body, from the
// request's fields. It returns the release of the parsed message, to call once answered, or
// answers 400 and returns false.
func (h *Handler) readRequest(w http.ResponseWriter, r *http.Request, req *affinity.Request, body []byte) (release func(), ok bool) {
	if len(body) == 0 {
		if rej := fromFields(r, req); rej != "" {
			h.fail(w, http.StatusBadRequest, "MissingFields", rej, 0)
			return nil, false
		}
		return func() {}, true
	}
	m, err := dcr.ParseSIPRequest(body)
	if err != nil {
		h.fail(w, http.StatusBadRequest, "InvalidSIPMessage", "cannot parse the SIP request: "+err.Error(), 0)
		return nil, false
	}
	req.SIPMessage, req.SIP = body, m
	return m.Release, true
}

// decide asks for req's decision and its instance, which must have a SIP port; on false it
// has answered. The caller ends the decision.
func (h *Handler) decide(w http.ResponseWriter, r *http.Request, req affinity.Request) (affinity.Decision, registry.Instance, bool) {
	d, err := h.d.Decide(r.Context(), req)
	if err != nil {
		h.failDecision(w, req.Service, err)
		return nil, registry.Instance{}, false
	}
	inst := d.Instance()
	if !h.hasSIPPort(w, req.Service, inst) {
		d.End()
		return nil, registry.Instance{}, false
	}
	return d, inst, true
}

// hasSIPPort answers 503 NoSIPEndpoint and returns false when inst has no SIP port.
func (h *Handler) hasSIPPort(w http.ResponseWriter, service string, inst registry.Instance) bool {
	if inst.SIPPort != 0 {
		return true
	}
	h.log.Error("sipdecide: chosen instance has no SIP port", "service", service, "instance", inst.ID)
	h.fail(w, http.StatusServiceUnavailable, "NoSIPEndpoint",
		fmt.Sprintf("instance %q of service %q has no SIP port", inst.ID, service), 0)
	return false
}

// writeURI answers 200 with inst's SIP URI, followed by suffix (URI parameters).
func (h *Handler) writeURI(w http.ResponseWriter, inst registry.Instance, suffix string) {
	a := h.answers.of(inst, h.transport)
	hd := w.Header()
	hd["Content-Type"] = textPlain
	hd[wire.SIPInstanceHeader] = a.id
	hd["Cache-Control"] = noStore
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, a.uri)
	if suffix != "" {
		_, _ = io.WriteString(w, suffix)
	}
}

// Header values shared by every answer. net/http only reads them; a length-1 slice cannot be
// appended to in place, so a later Header().Add copies instead of writing into them.
var (
	textPlain = []string{"text/plain; charset=utf-8"}
	noStore   = []string{"no-store"}
)

// answer is what a 200 answer for one instance carries, built once per instance.
type answer struct {
	uri string   // "sip:host:port[;transport=t]"
	id  []string // the X-Tether-Instance value
}

// answerKey is what answer depends on.
type answerKey struct {
	id, address string
	port        int
}

// maxAnswers bounds the answer cache; instances come and go, so past it the cache starts over.
const maxAnswers = 4096

// answerCache holds the answers of the instances decided so far. Safe for concurrent use.
type answerCache struct {
	m sync.Map // answerKey → *answer
	n atomic.Int64
}

func (c *answerCache) of(inst registry.Instance, transport string) *answer {
	k := answerKey{inst.ID, inst.Address, inst.SIPPort}
	if a, ok := c.m.Load(k); ok {
		return a.(*answer)
	}
	uri := "sip:" + net.JoinHostPort(inst.Address, strconv.Itoa(inst.SIPPort))
	if transport != "" {
		uri += ";transport=" + transport
	}
	a := &answer{uri: uri, id: []string{inst.ID}}
	if c.n.Add(1) > maxAnswers {
		c.m.Clear()
		c.n.Store(1)
	}
	c.m.Store(k, a)
	return a
}

// serviceFromPath parses "/v1/sip/{service}/decide" (service) and "/v1/sip/decide" ("").
func serviceFromPath(p string) (string, bool) {
	rest, ok := strings.CutPrefix(p, PathPrefix)
	if !ok {
		return "", false
	}
	if rest == "decide" {
		return "", true
	}
	service, ok := strings.CutSuffix(rest, "/decide")
	if !ok || service == "" || strings.Contains(service, "/") {
		return "", false
	}
	return service, true
}

var errTooLarge = fmt.Errorf("SIP message larger than %d bytes", MaxMessageSize)

// bodies recycles request-body buffers: a decision reads its body into one and hands it back
// when the answer is written.
var bodies = sync.Pool{New: func() any { b := make([]byte, 0, 2048); return &b }}

// readBody reads rc, at most MaxMessageSize bytes, into a pooled buffer; the caller returns it
// with putBody. An absent body is an empty buffer.
func readBody(rc io.ReadCloser) (*[]byte, error) {
	bp := bodies.Get().(*[]byte)
	b := (*bp)[:0]
	if rc == nil || rc == http.NoBody {
		*bp = b
		return bp, nil
	}
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := rc.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if len(b) > MaxMessageSize {
			*bp = b
			putBody(bp)
			return nil, errTooLarge
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			*bp = b
			putBody(bp)
			return nil, fmt.Errorf("reading body: %w", err)
		}
	}
	*bp = b
	return bp, nil
}

func putBody(bp *[]byte) {
	if cap(*bp) <= 2*MaxMessageSize {
		*bp = (*bp)[:0]
		bodies.Put(bp)
	}
}

// fromFields fills req from the selected-fields form; it returns a reason when a field the
// engine needs is missing.
func fromFields(r *http.Request, req *affinity.Request) string {
	q := r.URL.Query()
	req.Method = q.Get("method")
	req.Path = q.Get("ruri")
	if req.Method == "" || req.Path == "" {
		return "an empty body needs the query parameters method and ruri (and from, to, callid)"
	}
	req.Headers = map[string][]string{}
	for _, f := range [...]struct{ param, header string }{
		{"from", "from"}, {"to", "to"}, {"callid", "call-id"},
		{"pai", "p-asserted-identity"}, {"psu", "p-served-user"},
	} {
		if v := q.Get(f.param); v != "" {
			req.Headers[f.header] = []string{v}
		}
	}
	if len(req.Headers["from"]) == 0 && len(req.Headers["call-id"]) == 0 {
		return "an empty body needs at least one of the query parameters from and callid"
	}
	return ""
}

// failDecision maps an engine error to an answer.
func (h *Handler) failDecision(w http.ResponseWriter, service string, err error) {
	var rej *affinity.Reject
	if !errors.As(err, &rej) {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			h.log.Warn("sipdecide: decision abandoned", "service", service, "err", err)
			h.fail(w, http.StatusServiceUnavailable, "Unavailable", "decision abandoned: "+err.Error(), time.Second)
			return
		}
		h.log.Error("sipdecide: decision failed", "service", service, "err", err)
		h.fail(w, http.StatusInternalServerError, wire.InternalCode, "decision failed", 0)
		return
	}
	row := wire.Lookup(rej.Class)
	code := rej.Code
	if code == "" {
		code = row.Code
	}
	h.log.Debug("sipdecide: rejected", "service", service, "status", row.HTTPStatus, "code", code, "msg", rej.Message)
	h.fail(w, row.HTTPStatus, code, rej.Message, rej.RetryAfter)
}

// StatusOf maps a rejection class to the HTTP status of the decision endpoint (wire.Lookup).
func StatusOf(c affinity.Class) int { return wire.Lookup(c).HTTPStatus }

func (h *Handler) fail(w http.ResponseWriter, status int, code, msg string, retryAfter time.Duration) {
	hd := w.Header()
	hd["Content-Type"] = []string{"application/json"}
	hd["Cache-Control"] = []string{"no-store"}
	if retryAfter > 0 || status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests {
		hd["Retry-After"] = []string{strconv.FormatInt(wire.RetryAfterSeconds(retryAfter), 10)}
	}
	body, _ := json.Marshal(wire.ErrorBody{ErrorCode: code, ErrorMessage: msg}) // cannot fail: two strings
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
