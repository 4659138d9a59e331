package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/wire"
)

func (s *Server) registerAdmin(mux *http.ServeMux) {
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.HandleFunc("GET /v1/services", s.listServices)
	mux.HandleFunc("GET /v1/services/{service}", s.getService)
}

// healthz answers 200 "ok" while the process serves HTTP at all (liveness).
func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok\n"))
}

// readyz answers 200 when a config has been applied to the registry (generation > 0) and every
// readiness check passes, 503 with the reason otherwise.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if s.reg.Snapshot().Generation == 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("not ready: no configuration loaded\n"))
		return
	}
	for _, c := range s.ready {
		if err := c.check(r.Context()); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = fmt.Fprintf(w, "not ready: %s: %v\n", c.name, err)
			return
		}
	}
	_, _ = w.Write([]byte("ok\n"))
}

// ServiceView is the JSON form of one service's settings on /v1/services. Field names follow
// the config file; durations are Go duration strings ("6h0m0s").
type ServiceView struct {
	Name                    string          `json:"name"`
	Match                   MatchView       `json:"match"`
	Affinity                string          `json:"affinity"`
	Balancing               string          `json:"balancing"`
	SessionsPerInstance     int             `json:"sessionsPerInstance"`
	RequestSlotsPerInstance int             `json:"requestSlotsPerInstance"`
	SessionTTL              string          `json:"sessionTTL"`
	IdleTimeout             string          `json:"idleTimeout"`
	MaxLifetime             string          `json:"maxLifetime"`
	DisableSessionIDReuse   bool            `json:"disableSessionIdReuse"`
	Cookie                  CookieView      `json:"cookie"`
	Sticky                  StickyView      `json:"sticky"`
	HeaderField             string          `json:"headerField"`
	SSE                     SSEView         `json:"sse"`
	DCRFile                 string          `json:"dcrFile"`
	HashBalanceFactor       float64         `json:"hashBalanceFactor"`
	Upstream                UpstreamView    `json:"upstream"`
	HealthCheck             HealthCheckView `json:"healthCheck"`
	Instances               int             `json:"instances"`
}

// MatchView is the JSON form of registry.Match.
type MatchView struct {
	Authorities []string `json:"authorities"`
	PathPrefix  string   `json:"pathPrefix"`
}

// CookieView is the JSON form of registry.Cookie.
type CookieView struct {
	Name     string `json:"name"`
	Path     string `json:"path"`
	Secure   bool   `json:"secure"`
	HTTPOnly bool   `json:"httpOnly"`
	SameSite string `json:"sameSite"`
}

// StickyView is the JSON form of registry.Sticky.
type StickyView struct {
	UpstreamCookie string `json:"upstreamCookie"`
}

// SSEView is the JSON form of registry.SSE.
type SSEView struct {
	Path         string `json:"path"`
	SessionParam string `json:"sessionParam"`
}

// UpstreamView is the JSON form of a service's upstream settings.
type UpstreamView struct {
	Protocol       string `json:"protocol"`
	ConnectTimeout string `json:"connectTimeout"`
}

// HealthCheckView is the JSON form of registry.HealthCheck.
type HealthCheckView struct {
	Path               string `json:"path"`
	Interval           string `json:"interval"`
	Timeout            string `json:"timeout"`
	HealthyThreshold   int    `json:"healthyThreshold"`
	UnhealthyThreshold int    `json:"unhealthyThreshold"`
}

func serviceView(svc registry.Service, instances int) ServiceView {
	proto := "http1"
	if svc.UpstreamHTTP2 {
		proto = "http2"
	}
	auth := svc.Match.Authorities
	if auth == nil {
		auth = []string{}
	}
	return ServiceView{
		Name:                    svc.Name,
		Match:                   MatchView{Authorities: slices.Clone(auth), PathPrefix: svc.Match.PathPrefix},
		Affinity:                string(svc.Affinity),
		Balancing:               string(svc.Balancing),
		SessionsPerInstance:     svc.SessionsPerInstance,
		RequestSlotsPerInstance: svc.RequestSlotsPerInstance,
		SessionTTL:              svc.SessionTTL.String(),
		IdleTimeout:             svc.IdleTimeout.String(),
		MaxLifetime:             svc.MaxLifetime.String(),
		DisableSessionIDReuse:   svc.DisableSessionIDReuse,
		Cookie: CookieView{Name: svc.Cookie.Name, Path: svc.Cookie.Path, Secure: svc.Cookie.Secure,
			HTTPOnly: svc.Cookie.HTTPOnly, SameSite: svc.Cookie.SameSite},
		Sticky:            StickyView{UpstreamCookie: svc.Sticky.UpstreamCookie},
		HeaderField:       svc.HeaderField,
		SSE:               SSEView{Path: svc.SSE.Path, SessionParam: svc.SSE.SessionParam},
		DCRFile:           svc.DCRFile,
		HashBalanceFactor: svc.HashBalanceFactor,
		Upstream:          UpstreamView{Protocol: proto, ConnectTimeout: svc.ConnectTimeout.String()},
		HealthCheck: HealthCheckView{Path: svc.HealthCheck.Path, Interval: svc.HealthCheck.Interval.String(),
			Timeout: svc.HealthCheck.Timeout.String(), HealthyThreshold: svc.HealthCheck.HealthyThreshold,
			UnhealthyThreshold: svc.HealthCheck.UnhealthyThreshold},
		Instances: instances,
	}
}

// ServiceList is the JSON body of GET /v1/services.
type ServiceList struct {
	Generation uint64        `json:"generation"`
	Services   []ServiceView `json:"services"`
}

func (s *Server) listServices(w http.ResponseWriter, r *http.Request) {
	snap := s.reg.Snapshot()
	out := ServiceList{Generation: snap.Generation, Services: []ServiceView{}}
	for _, svc := range snap.Services() {
		if !s.mayRead(r.Context(), svc.Name) {
			continue // a token sees only the services it may read
		}
		out.Services = append(out.Services, serviceView(svc, len(snap.Instances(svc.Name))))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getService(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("service")
	if err := s.authorize(r.Context(), name, accessRead); err != nil {
		writeStatus(w, err)
		return
	}
	snap := s.reg.Snapshot()
	svc, ok := snap.Service(name)
	if !ok {
		writeError(w, codes.NotFound, wire.Lookup(wire.ClassNoService).Code, fmt.Sprintf("service %q not found", name))
		return
	}
	writeJSON(w, http.StatusOK, serviceView(svc, len(snap.Instances(name))))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		writeError(w, codes.Internal, wire.InternalCode, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// writeError writes the one error model of the HTTP/JSON API (wire.ErrorBody) with c's HTTP
// status (httpStatus): errorCode is code (c's name when code is ""), status c's name.
func writeError(w http.ResponseWriter, c codes.Code, code, msg string) {
	if code == "" {
		code = c.String()
	}
	b, _ := json.Marshal(wire.ErrorBody{ErrorCode: code, ErrorMessage: strings.TrimSpace(msg), Status: c.String()})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(httpStatus(c))
	_, _ = w.Write(append(b, '\n'))
}
