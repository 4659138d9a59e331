package api

import (
	"net/http"
	"strings"
)

// operatorHandler is a read-only endpoint about tether itself rather than one service (e.g.
// the xDS node status), mounted on the API listener.
type operatorHandler struct {
	pattern string
	h       http.Handler
}

// WithOperatorHandler mounts h at pattern (an http.ServeMux pattern such as
// "GET /v1/xds/nodes") on the API listener. With auth configured, only tokens that may read
// every service ("*") may call it, since it describes the whole deployment; a pattern of any
// method but GET or HEAD changes the deployment (e.g. "POST /v1/replica/drain") and needs a
// write token scoped to every service.
func WithOperatorHandler(pattern string, h http.Handler) Option {
	return func(s *Server) { s.operator = append(s.operator, operatorHandler{pattern: pattern, h: h}) }
}

func (s *Server) registerOperator(mux *http.ServeMux) {
	for _, o := range s.operator {
		h := o.h
		level := accessRead
		if method, _, ok := strings.Cut(o.pattern, " "); !ok || method != http.MethodGet && method != http.MethodHead {
			level = accessWrite
		}
		mux.HandleFunc(o.pattern, func(w http.ResponseWriter, r *http.Request) {
			if err := s.requireAllAt(r.Context(), level); err != nil {
				writeStatus(w, err)
				return
			}
			h.ServeHTTP(w, r)
		})
	}
}
