package wire_test

import (
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/tether-dev/tether/pkg/wire"
)

// TestModeValuesAreEnvoys pins the conversion pkg/xds and pkg/extproc rely on: wire's send
// modes carry Envoy's enum numbers.
func TestModeValuesAreEnvoys(t *testing.T) {
	for _, tc := range []struct {
		name string
		got  int32
		want int32
	}{
		{"DEFAULT", int32(wire.HeaderDefault), int32(extprocv3.ProcessingMode_DEFAULT)},
		{"SEND", int32(wire.HeaderSend), int32(extprocv3.ProcessingMode_SEND)},
		{"SKIP", int32(wire.HeaderSkip), int32(extprocv3.ProcessingMode_SKIP)},
		{"NONE", int32(wire.BodyNone), int32(extprocv3.ProcessingMode_NONE)},
		{"STREAMED", int32(wire.BodyStreamed), int32(extprocv3.ProcessingMode_STREAMED)},
		{"FULL_DUPLEX_STREAMED", int32(wire.BodyFullDuplexStreamed), int32(extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED)},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: wire %d, Envoy %d", tc.name, tc.got, tc.want)
		}
	}
	base, sse := wire.BaseProcessingMode(), wire.StreamedResponseBodyMode()
	if base.ResponseTrailers != wire.HeaderSend || base.ResponseBody != wire.BodyNone {
		t.Errorf("base mode %+v must send response trailers and no body", base)
	}
	if sse.ResponseBody != wire.BodyStreamed || sse.ResponseTrailers != wire.HeaderSend || sse.RequestHeaders != wire.HeaderSend {
		t.Errorf("SSE mode %+v must stream the response body and keep every other part of the base mode", sse)
	}
	fd := wire.FullDuplexProcessingMode()
	if fd.RequestBody != wire.BodyFullDuplexStreamed || fd.ResponseBody != wire.BodyFullDuplexStreamed ||
		fd.RequestTrailers != wire.HeaderSend || fd.ResponseTrailers != wire.HeaderSend {
		t.Errorf("full-duplex mode %+v must stream both bodies with trailers SEND both ways (Envoy requires it)", fd)
	}
}
