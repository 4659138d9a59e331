package main

import (
	"net/http"
	"net/http/pprof"

	"github.com/tether-dev/tether/pkg/api"
)

// pprofHandlers mounts Go's profiler at /debug/pprof/ on the API listener. As an operator
// endpoint it needs a token scoped to every service ("*") when auth is configured.
func pprofHandlers() []api.Option {
	return []api.Option{
		api.WithOperatorHandler("GET /debug/pprof/", pprofIndex()),
		api.WithOperatorHandler("GET /debug/pprof/cmdline", handlerFunc(pprof.Cmdline)),
		api.WithOperatorHandler("GET /debug/pprof/profile", handlerFunc(pprof.Profile)),
		api.WithOperatorHandler("GET /debug/pprof/symbol", handlerFunc(pprof.Symbol)),
		api.WithOperatorHandler("POST /debug/pprof/symbol", handlerFunc(pprof.Symbol)),
		api.WithOperatorHandler("GET /debug/pprof/trace", handlerFunc(pprof.Trace)),
	}
}

func pprofIndex() http.Handler { return http.HandlerFunc(pprof.Index) }

func handlerFunc(f func(http.ResponseWriter, *http.Request)) http.Handler { return http.HandlerFunc(f) }
