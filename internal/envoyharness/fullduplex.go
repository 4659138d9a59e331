package envoyharness

import (
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// FULL_DUPLEX_STREAMED bodies (processing_mode.{request,response}_body_mode): Envoy sends each
// body chunk to the processor as it arrives, without waiting for answers, and forwards only
// what the processor streams back in StreamedBodyResponse messages; the end of the body is the
// trailers message when there are trailers, else a chunk with end_of_stream. No
// message_timeout applies to body answers; mode_override is ignored; content-length is removed
// (the body may change). An answer of another kind, or a body answer without a
// streamed_response, is spurious.

// noTimeout stands for "no message_timeout" while waiting for full-duplex body answers.
const noTimeout = 24 * time.Hour

var errSpuriousBodyAnswer = errors.New("envoyharness: body answer without streamed_response")

// fullDuplex reports whether the request (or response) body mode is FULL_DUPLEX_STREAMED.
func (ex *exchange) fullDuplex(request bool) bool {
	m := ex.mode.GetResponseBodyMode()
	if request {
		m = ex.mode.GetRequestBodyMode()
	}
	return m == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
}

// fullDuplexRequestHeaders sends request_headers, starts streaming the request body to the
// processor at once (pumpRequestBody), and waits for the headers answer. The upstream request
// body is what the processor streams back (ex.requestBody).
func (ex *exchange) fullDuplexRequestHeaders(msg *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, bool) {
	h := ex.h
	if err := ex.stream.send(msg); err != nil && !errors.Is(err, io.EOF) {
		h.stats.streamErrors.Add(1)
		ex.fail(h.statusOnError, "ext_proc_error_gRPC_error_send")
		return nil, false
	}
	pr, pw := io.Pipe()
	ex.requestBody = pr
	ex.requestPump = make(chan struct{})
	st := ex.stream
	go func() {
		defer close(ex.requestPump)
		ex.pumpRequestBody(st)
	}()
	go ex.forwardRequestBody(st, pw)
	return ex.answer(true, ex.messageTimeout(true))
}

// pumpRequestBody sends the downstream request body as request_body messages, then a last,
// empty chunk with end_of_stream (the codec reports the end separately). It stops when the
// body or the side stream fails.
func (ex *exchange) pumpRequestBody(st *sideStream) {
	buf := make([]byte, 32<<10)
	for {
		n, err := ex.r.Body.Read(buf)
		if n > 0 {
			chunk := append([]byte(nil), buf[:n]...)
			if st.send(bodyMessage(chunk, false, true)) != nil {
				return
			}
		}
		if errors.Is(err, io.EOF) {
			_ = st.send(bodyMessage(nil, true, true))
			return
		}
		if err != nil {
			return // the client went away: the filter is destroyed
		}
	}
}

// forwardRequestBody writes the processor's streamed request-body answers into the upstream
// request body, in order, and closes it after the answer with end_of_stream. A spurious answer
// or the end of the side stream fails the upstream request.
func (ex *exchange) forwardRequestBody(st *sideStream, pw *io.PipeWriter) {
	for resp := range st.reqBody {
		sr := resp.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			// Spurious: Envoy closes the side stream and fails closed with a local reply
			// (status_on_error; a reset once the response started) that skips ext_proc — it
			// never becomes a router 503 seen by the processor as response_headers.
			ex.h.stats.spurious.Add(1)
			ex.reqSpurious.Store(true)
			st.close()
			ex.upCancel()
			_ = pw.CloseWithError(errSpuriousBodyAnswer)
			return
		}
		if len(sr.GetBody()) > 0 {
			if _, err := pw.Write(sr.GetBody()); err != nil {
				return
			}
		}
		if sr.GetEndOfStream() {
			_ = pw.Close()
			return
		}
	}
	_ = pw.CloseWithError(errStreamClosed)
}

func bodyMessage(chunk []byte, eos, request bool) *extprocv3.ProcessingRequest {
	b := &extprocv3.HttpBody{Body: chunk, EndOfStream: eos}
	if request {
		return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: b}}
	}
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: b}}
}

// fullDuplexRespond is respond with a FULL_DUPLEX_STREAMED response body: response_headers,
// then the body streamed to the processor as it arrives (pumpResponseBody) while the answers
// are written to the client as they come back, until the answer with end_of_stream or the
// trailers answer. The side stream then closes (closeGrpcStreamIfLastRespReceived).
func (ex *exchange) fullDuplexRespond(hdr *headerMap, body io.Reader, noBody bool, upstream *http.Response) {
	h := ex.h
	msg := &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: hdr.proto(), EndOfStream: noBody,
		}},
		MetadataContext: ex.forwardedMetadata(),
	}
	if err := ex.stream.send(msg); err != nil && !errors.Is(err, io.EOF) {
		h.stats.streamErrors.Add(1)
		ex.fail(h.statusOnError, "ext_proc_error_gRPC_error_send")
		return
	}
	trailers := make(chan *headerMap, 1)
	pump := &responsePump{handoff: make(chan struct{}), direct: make(chan []byte), abort: make(chan struct{})}
	defer close(pump.abort) // whatever way this ends, the pump stops waiting for it
	if !noBody {
		ex.responsePump = make(chan struct{})
		st := ex.stream
		go func() {
			defer close(ex.responsePump)
			ex.pumpResponseBody(st, body, upstream, trailers, pump)
		}()
	}
	resp, ok := ex.answer(true, ex.messageTimeout(false))
	if !ok {
		return
	}
	if resp != nil {
		rr, isHeaders := resp.GetResponse().(*extprocv3.ProcessingResponse_ResponseHeaders)
		if !isHeaders {
			ex.spurious()
			return
		}
		ex.setDynamicMetadata(resp)
		if !ex.mutate(rr.ResponseHeaders.GetResponse().GetHeaderMutation(), hdr) {
			return
		}
	}
	hdr.remove("content-length")
	if noBody {
		ex.closeEarly()
	}
	ex.writeHeaders(hdr)
	if noBody {
		return
	}
	fl, _ := ex.w.(http.Flusher)
	var answered uint64
	for resp != nil {
		resp, ok = ex.answer(false, noTimeout)
		if !ok {
			panic(http.ErrAbortHandler) // headers are out: Envoy resets the stream
		}
		if resp == nil {
			break // closed with OK mid-body: the rest passes through (below)
		}
		switch rr := resp.GetResponse().(type) {
		case *extprocv3.ProcessingResponse_ResponseBody:
			sr := rr.ResponseBody.GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr == nil {
				ex.spurious()
				return
			}
			ex.setDynamicMetadata(resp)
			answered++
			if len(sr.GetBody()) > 0 {
				if _, err := ex.w.Write(sr.GetBody()); err != nil {
					return
				}
				if fl != nil {
					fl.Flush()
				}
			}
			if sr.GetEndOfStream() {
				ex.closeEarly()
				return
			}
		case *extprocv3.ProcessingResponse_ResponseTrailers:
			th := <-trailers
			ex.setDynamicMetadata(resp)
			if _, err := applyMutation(rr.ResponseTrailers.GetHeaderMutation(), th, h.semantics); err != nil {
				h.stats.mutationErrors.Add(1)
				panic(http.ErrAbortHandler)
			}
			ex.closeEarly()
			for _, e := range th.entries {
				ex.w.Header().Add(http.TrailerPrefix+e.key, e.value)
			}
			return
		default:
			ex.spurious()
			return
		}
	}
	// The processor closed the stream with OK before the body ended (onGrpcClose:
	// processing_complete_, so Filter::onData lets every later chunk through). In
	// FULL_DUPLEX_STREAMED Envoy keeps no copy of a chunk it sent to the processor, so chunks
	// sent and not yet answered are lost: a processor ending with OK while body data flows
	// must first drain (ProcessingResponse.request_drain_responses, which Envoy has not
	// implemented). The harness counts them (Stats.FullDuplexChunksLost).
	close(pump.handoff)
	for chunk := range pump.direct {
		if _, err := ex.w.Write(chunk); err != nil {
			return
		}
		if fl != nil {
			fl.Flush()
		}
	}
	if lost := pump.sent.Load() - answered; lost > 0 {
		h.stats.fullDuplexLost.Add(lost)
	}
	if pump.failed.Load() {
		panic(http.ErrAbortHandler) // the upstream body failed: Envoy resets the stream
	}
	select {
	case th := <-trailers:
		for _, e := range th.entries {
			ex.w.Header().Add(http.TrailerPrefix+e.key, e.value)
		}
	default:
	}
}

// responsePump is the full-duplex response pump's switch to pass-through: once handoff is
// closed (the processor ended the stream with OK), chunks go to direct instead of the side
// stream; direct is closed at the end of the body.
type responsePump struct {
	handoff chan struct{}
	direct  chan []byte
	abort   chan struct{} // closed when fullDuplexRespond returns
	sent    atomic.Uint64 // chunks sent to the processor
	failed  atomic.Bool   // the upstream body ended with an error after the handoff
}

// pass hands chunk to the answer loop once it passes the body through; false when the
// exchange ended first (a reset, or the client went away).
func (p *responsePump) pass(chunk []byte) bool {
	select {
	case <-p.handoff:
	case <-p.abort:
		return false
	}
	select {
	case p.direct <- chunk:
		return true
	case <-p.abort:
		return false
	}
}

// pumpResponseBody sends the upstream body as response_body messages as it arrives; at its
// end, response_trailers when the upstream sent trailers (handed to the answer loop through
// trailers first), else an empty last chunk with end_of_stream. An upstream read error resets
// the side stream (Envoy resets the downstream stream).
func (ex *exchange) pumpResponseBody(st *sideStream, body io.Reader, upstream *http.Response, trailers chan<- *headerMap, p *responsePump) {
	handedOff := func() bool {
		select {
		case <-p.handoff:
			return true
		default:
			return false
		}
	}
	defer func() {
		if handedOff() {
			close(p.direct)
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := body.Read(buf)
		if n > 0 {
			chunk := append([]byte(nil), buf[:n]...)
			if !handedOff() && st.send(bodyMessage(chunk, false, false)) == nil {
				p.sent.Add(1)
			} else if !p.pass(chunk) { // handed off (an OK close that raced this send included)
				return
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if handedOff() {
				p.failed.Store(true)
				return
			}
			st.close()
			return
		}
	}
	if t := ex.upstreamTrailers(upstream); len(t) > 0 {
		var th headerMap
		th.fromHTTP(t)
		trailers <- &th
		if handedOff() {
			return
		}
		_ = st.send(&extprocv3.ProcessingRequest{
			Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{Trailers: th.proto()}},
		})
		return
	}
	if !handedOff() {
		_ = st.send(bodyMessage(nil, true, false))
	}
}

// writeHeaders writes the response headers to the client.
func (ex *exchange) writeHeaders(hdr *headerMap) {
	status := http.StatusBadGateway
	if v := hdr.first(":status"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n >= 100 {
			status = n
		}
	}
	for _, e := range hdr.entries {
		if !strings.HasPrefix(e.key, ":") {
			ex.w.Header().Add(e.key, e.value)
		}
	}
	ex.w.WriteHeader(status)
	ex.headersSent = true
}
