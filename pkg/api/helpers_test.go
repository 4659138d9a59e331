package api_test

import (
	"io"
	"log/slog"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
)

func newTextLogger(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }

func httpReq(service string) affinity.Request {
	return affinitytest.HTTP(service, "GET", "/")
}
