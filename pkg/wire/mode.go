package wire

// HeaderMode says whether ext_proc sends headers or trailers to tether. Its values are those
// of Envoy's ProcessingMode.HeaderSendMode, so pkg/xds and pkg/extproc convert by a plain
// conversion without this package importing Envoy types.
type HeaderMode int32

// Header send modes (Envoy's names).
const (
	HeaderDefault HeaderMode = 0 // DEFAULT
	HeaderSend    HeaderMode = 1 // SEND
	HeaderSkip    HeaderMode = 2 // SKIP
)

// BodyMode says how ext_proc sends a body to tether; values of Envoy's
// ProcessingMode.BodySendMode.
type BodyMode int32

// Body send modes (Envoy's names).
const (
	BodyNone     BodyMode = 0 // NONE
	BodyStreamed BodyMode = 1 // STREAMED
	// BodyFullDuplexStreamed: every chunk goes to tether as it arrives and reaches the other
	// side only in tether's answer; the trailer mode of that direction must be SEND.
	BodyFullDuplexStreamed BodyMode = 4 // FULL_DUPLEX_STREAMED
)

// ProcessingMode is which parts of an exchange ext_proc sends to tether.
type ProcessingMode struct {
	RequestHeaders, ResponseHeaders   HeaderMode
	RequestBody, ResponseBody         BodyMode
	RequestTrailers, ResponseTrailers HeaderMode
}

// BaseProcessingMode is the processing mode tether configures on Envoy's ext_proc filter and
// assumes for every exchange: request and response headers SEND; bodies NONE; request trailers
// SKIP; response trailers SEND. Sending response trailers keeps the side stream open until the
// HTTP exchange ends on Envoy ≥ 1.37, so tether releases the request slot at the real end of a
// long response.
func BaseProcessingMode() ProcessingMode {
	return ProcessingMode{
		RequestHeaders:   HeaderSend,
		ResponseHeaders:  HeaderSend,
		RequestBody:      BodyNone,
		ResponseBody:     BodyNone,
		RequestTrailers:  HeaderSkip,
		ResponseTrailers: HeaderSend,
	}
}

// StreamedResponseBodyMode is the base mode with the response body STREAMED: the mode
// override tether asks for on an MCP HTTP+SSE GET, whose first endpoint event announces the
// session. Every field is explicit: older Envoys replace the whole mode with an override.
func StreamedResponseBodyMode() ProcessingMode {
	m := BaseProcessingMode()
	m.ResponseBody = BodyStreamed
	return m
}

// FullDuplexProcessingMode is the processing mode of a service whose bodies stream through
// tether (services[].bodyMode full-duplex; what Envoy Gateway's EnvoyExtensionPolicy and the
// Gateway API Inference Extension's endpoint-picker protocol configure): headers SEND, request
// and response bodies FULL_DUPLEX_STREAMED, trailers SEND both ways (Envoy requires SEND with
// that body mode). tether passes every chunk through unchanged; the side stream ends with the
// last chunk or the trailers, so the request slot is released at the real end of the exchange.
func FullDuplexProcessingMode() ProcessingMode {
	return ProcessingMode{
		RequestHeaders:   HeaderSend,
		ResponseHeaders:  HeaderSend,
		RequestBody:      BodyFullDuplexStreamed,
		ResponseBody:     BodyFullDuplexStreamed,
		RequestTrailers:  HeaderSend,
		ResponseTrailers: HeaderSend,
	}
}
