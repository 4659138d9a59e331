package sipdecide

import (
	"log/slog"
	"net/http"
	"time"
)

// ReadTimeout bounds reading one decision request, headers and body: Kamailio sends a decision
// request (≤ 64 KiB, MaxMessageSize) at once, so a client that trickles its headers or body is
// cut off rather than held.
const ReadTimeout = 5 * time.Second

// NewServer returns the HTTP server of the decision endpoint h as tether serve runs it (the
// read, write and idle timeouts, the header size limit, net/http's own errors logged to log at
// warning level). The caller serves it on its listener (TLS or not).
func NewServer(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: ReadTimeout,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      2 * ReadTimeout,
		IdleTimeout:       time.Minute,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}
