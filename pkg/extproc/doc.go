// Package extproc is tether's Envoy external processor: an
// envoy.service.ext_proc.v3.ExternalProcessor gRPC server that turns each Envoy ext_proc stream
// (one per HTTP request) into a protocol-neutral affinity.Request, asks the engine for a
// Decision, and answers Envoy with the chosen instance — as the destination header and as
// dynamic metadata under the envoy.lb namespace, the two inputs of Envoy's override_host
// load-balancing policy — or with an ImmediateResponse when the engine refuses the request.
//
// # Message handling
//
//   - request_headers: the service comes from the x-tether-service gRPC initial metadata (set
//     per route by the generated Envoy config) or, when absent, from :authority and :path; the
//     peer comes from the source.address / source.port request attributes. The answer always
//     overwrites the destination header, so a client-supplied copy never survives.
//   - Every header mutation says what it means, the same to Envoy and to gRPC's ext_proc
//     (gRFC A93, which reads append_action only and appends by default): overwrites (the
//     destination header, echoed ids, rejection headers) carry append_action
//     OVERWRITE_IF_EXISTS_OR_ADD; appends (Set-Cookie) carry APPEND_IF_EXISTS_OR_ADD with the
//     legacy append true, which Envoy needs for that enum-zero action. Values go in raw_value.
//   - response_headers: Decision.OnResponse gives the headers to add (Set-Cookie appended,
//     everything else overwritten). The served host Envoy
//     reports in metadata_context (selected_host_key) is compared with the chosen instance;
//     mismatches are counted and logged at Warn. A Decision that wants the response body (MCP
//     SSE) gets a mode_override to a STREAMED response body when the response is 2xx and has a
//     body; the override sets every field explicitly (see streamedResponseBodyMode), which
//     matters if the Envoy config restricts allowed_override_modes.
//   - response_body: chunks are fed to an SSE scanner until the first "endpoint" event names
//     the session id; every chunk is passed on unchanged.
//   - FULL_DUPLEX_STREAMED bodies (announced in the first message's protocol_config; set by
//     services[].bodyMode full-duplex or by the gateway): every request_body and response_body
//     chunk is answered with itself as a StreamedBodyResponse, end_of_stream kept; no
//     mode_override is sent; SSE learning reads the chunks as they pass.
//   - request_body (other modes), request_trailers, response_trailers: answered with CONTINUE.
//
// # Endpoint-picker attachment
//
// A stream without x-tether-service is for the WithDefaultService service when one is set
// (Gateway API Inference Extension, Envoy Gateway, Istio). The data plane's subset hint
// (wire.SubsetHintNamespace/SubsetHintKey in metadata_context) becomes affinity.Request.Subset:
// the pick stays inside it, and a 503 answers when nothing in it can serve. The health
// service answers LivenessService and ReadinessService beside ServiceName.
//
// # gRPC callers
//
// A gRPC exchange gets rejections with grpc_status (the wire table's gRPC code) and, when
// retryable, grpc-retry-pushback-ms. An exchange is gRPC when Envoy proxies a request whose
// content-type is application/grpc[+codec], or when gRPC's own ext_proc filter (gRFC A93,
// proxyless clients) runs it: recognised by the data-plane initial metadata tether's xDS gives
// that filter (wire.DataPlaneMetadataKey), or by request headers without :method (Envoy always
// sends the pseudo headers; gRPC's filter sends only the application's metadata, no
// content-type). gRPC's filter makes the ImmediateResponse's details the status message, so
// for it tether sends "<code>: <message>" there (e.g. "NoCapacity: …"); behind Envoy the
// details stay tether_<code> and the JSON body becomes grpc-message. An exchange carrying
// tether's data-plane metadata is decided with affinity.Request.GRPCRing: its client's ring, not
// tether's destination header, picks the instance, and the engine counts the call where that
// ring sends it.
//
// # End of the exchange
//
// The Decision holds one request slot. It is ended exactly once, by a deferred call, however
// the stream ends: io.EOF (Envoy half-closed), codes.Canceled (Envoy reset the side stream,
// its default on filter destruction), the stream context ending, an ImmediateResponse sent,
// or any error.
//
// # Failure policy (fail closed)
//
// A *affinity.Reject becomes an ImmediateResponse with the class's status (400, 404, 409,
// 429 with retry-after, 503 with retry-after) and a JSON body {"errorCode","errorMessage"}.
// Any other engine error becomes an ImmediateResponse 500 with errorCode
// "InternalServerError" rather than a stream error: Envoy would turn a stream error into its
// own status_on_error reply without a body, and a clear JSON error is more useful to clients.
// Protocol violations by the client (a second request_headers on one stream, an empty
// message) end the stream with codes.FailedPrecondition or codes.InvalidArgument; Envoy then
// replies with status_on_error (fail closed, failure_mode_allow false).
package extproc
