package sipdecide_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/dcr/dcrtest"
	"github.com/tether-dev/tether/pkg/sipdecide"
)

// benchMessages are distinct initial INVITEs (distinct keys), cycled through by the benchmarks.
func benchMessages(n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = dcrtest.SIP(dcrtest.Request{
			RequestURI: fmt.Sprintf("sip:user%d@example.com", i),
			CallID:     fmt.Sprintf("%d-bench@192.0.2.10", i),
			FromTag:    fmt.Sprintf("tag%d", i),
			Headers: [][2]string{
				{"Contact", "<sip:alice@192.0.2.10:5060>"},
				{"Allow", "INVITE, ACK, CANCEL, OPTIONS, BYE"},
				{"Content-Type", "application/sdp"},
			},
			Body: "v=0\r\no=- 1 1 IN IP4 192.0.2.10\r\ns=-\r\nc=IN IP4 192.0.2.10\r\nt=0 0\r\nm=audio 4000 RTP/AVP 0\r\n",
		})
	}
	return out
}

// BenchmarkEngineDecideSIP is the baseline: the engine's SIP decision alone (SIP parse, DCR
// key, Maglev lookup), no HTTP.
func BenchmarkEngineDecideSIP(b *testing.B) {
	f := hashFixture(b, affinitytest.Instances("voice", 5))
	msgs := benchMessages(1024)
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		d, err := f.Engine.Decide(ctx, affinity.Request{Service: "voice", Protocol: affinity.ProtocolSIP, SIPMessage: msgs[i%len(msgs)]})
		if err != nil {
			b.Fatal(err)
		}
		d.End()
		i++
	}
}

// BenchmarkHandlerInProcess: the decision endpoint's ServeHTTP called directly (request
// parsing of the body, engine decision, answer), no network.
func BenchmarkHandlerInProcess(b *testing.B) {
	f := hashFixture(b, affinitytest.Instances("voice", 5))
	h := sipdecide.NewHandler(f.Engine)
	msgs := benchMessages(1024)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		req := httptest.NewRequest(http.MethodPost, "/v1/sip/voice/decide", bytes.NewReader(msgs[i%len(msgs)]))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			b.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
		i++
	}
}

// BenchmarkHandlerLoopback: decisions through a real HTTP server on loopback with keep-alive
// clients (what Kamailio's http_client does with keep_connections), in parallel.
func BenchmarkHandlerLoopback(b *testing.B) {
	f := hashFixture(b, affinitytest.Instances("voice", 5))
	srv := httptest.NewServer(sipdecide.NewHandler(f.Engine))
	b.Cleanup(srv.Close)
	msgs := benchMessages(1024)
	client := srv.Client()
	client.Transport.(*http.Transport).MaxIdleConnsPerHost = 64
	url := srv.URL + "/v1/sip/voice/decide"
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			resp, err := client.Post(url, "message/sip", bytes.NewReader(msgs[i%len(msgs)]))
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
			i++
		}
	})
}
