package extproc

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-dev/tether/pkg/affinity"
)

// feedAll feeds chunks in order and returns the first endpoint found.
func feedAll(limit int, chunks ...string) (data string, found, gaveUp bool) {
	s := newSSEScanner(limit)
	for _, c := range chunks {
		if data, found, gaveUp = s.feed([]byte(c)); found || gaveUp {
			return
		}
	}
	return
}

func TestSSEScannerFindsEndpointEvent(t *testing.T) {
	tests := []struct {
		name   string
		stream string
		want   string
		found  bool
	}{
		{"LF framing", "event: endpoint\ndata: /messages?sessionId=abc\n\n", "/messages?sessionId=abc", true},
		{"CRLF framing", "event: endpoint\r\ndata: /m?sessionid=abc\r\n\r\n", "/m?sessionid=abc", true},
		{"CR framing", "event: endpoint\rdata: /m?session_id=abc\r\r", "/m?session_id=abc", true},
		{"after a comment and another event", ": hello\n\nevent: message\ndata: {}\n\nevent: endpoint\ndata: /e?sessionId=x\n\n", "/e?sessionId=x", true},
		{"no space after colon", "event:endpoint\ndata:/e?sessionId=x\n\n", "/e?sessionId=x", true},
		{"only one leading space dropped", "event: endpoint\ndata:  /e\n\n", " /e", true},
		{"multi-line data joined with LF", "event: endpoint\ndata: a\ndata: b\n\n", "a\nb", true},
		{"BOM at start", "\xEF\xBB\xBFevent: endpoint\ndata: /e\n\n", "/e", true},
		{"id and retry fields ignored", "id: 7\nretry: 100\nevent: endpoint\ndata: /e\n\n", "/e", true},
		{"event type resets after dispatch", "event: endpoint\n\ndata: /x\n\n", "", false},
		{"endpoint without data is not dispatched", "event: endpoint\n\n", "", false},
		{"undispatched (no blank line yet)", "event: endpoint\ndata: /e\n", "", false},
		{"other event names ignored", "event: endpoints\ndata: /e\n\n", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Every way of splitting the stream into two chunks, and byte by byte.
			splits := [][]string{{tc.stream}}
			for i := 1; i < len(tc.stream); i++ {
				splits = append(splits, []string{tc.stream[:i], tc.stream[i:]})
			}
			bytewise := make([]string, len(tc.stream))
			for i := 0; i < len(tc.stream); i++ {
				bytewise[i] = tc.stream[i : i+1]
			}
			splits = append(splits, bytewise)
			for _, chunks := range splits {
				got, found, gaveUp := feedAll(1<<20, chunks...)
				if gaveUp || found != tc.found || got != tc.want {
					t.Fatalf("chunks %q: got (%q, found %v, gave up %v), want (%q, %v)", chunks, got, found, gaveUp, tc.want, tc.found)
				}
			}
		})
	}
}

func TestSSEScannerGivesUpAtLimit(t *testing.T) {
	big := strings.Repeat(": padding padding padding\n", 100)
	_, found, gaveUp := feedAll(1000, big, "event: endpoint\ndata: /e\n\n")
	if found || !gaveUp {
		t.Errorf("found=%v gaveUp=%v, want the scanner to give up after 1000 bytes", found, gaveUp)
	}
}

type paramDecision struct {
	affinity.Decision
	param string
}

func (p paramDecision) SSESessionParam() string { return p.param }

type plainDecision struct{ affinity.Decision }

func TestSessionIDFromEndpoint(t *testing.T) {
	tests := []struct {
		name      string
		data      string
		d         affinity.Decision
		wantParam string
		wantID    string
	}{
		{"TS style", "/messages?sessionId=abc", plainDecision{}, "sessionId", "abc"},
		{"Go SDK style", "/message?sessionid=abc", plainDecision{}, "sessionid", "abc"},
		{"python style", "/messages/?session_id=abc", plainDecision{}, "session_id", "abc"},
		{"absolute URI", "http://10.0.0.1:8080/messages?x=1&sessionId=abc", plainDecision{}, "sessionId", "abc"},
		{"decision names its parameter", "/m?sessionId=wrong&sid=right", paramDecision{param: "sid"}, "sid", "right"},
		{"no id", "/messages", plainDecision{}, "", ""},
		{"unparsable", "%zz", plainDecision{}, "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, id := sessionIDFromEndpoint(tc.data, tc.d)
			if diff := cmp.Diff([2]string{tc.wantParam, tc.wantID}, [2]string{p, id}); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestStatusFor(t *testing.T) {
	want := map[affinity.Class]int{
		affinity.ClassBadRequest: 400, affinity.ClassNotFound: 404, affinity.ClassConflict: 409,
		affinity.ClassTooManyRequests: 429, affinity.ClassNoCapacity: 503, affinity.ClassNoService: 404, 0: 500, 99: 500,
	}
	for c, w := range want {
		if got := StatusFor(c); got != w {
			t.Errorf("StatusFor(%d) = %d, want %d", c, got, w)
		}
	}
}

func TestPeerFromAttributes(t *testing.T) {
	tests := []struct {
		name  string
		addr  any
		port  any
		want  string
		unset bool
	}{
		{name: "address with port", addr: "192.0.2.1:5000", port: 5000.0, want: "192.0.2.1:5000"},
		{name: "address without port", addr: "192.0.2.1", port: 5000.0, want: "192.0.2.1:5000"},
		{name: "IPv6 with port", addr: "[2001:db8::1]:5000", port: 5000.0, want: "[2001:db8::1]:5000"},
		{name: "IPv6 without port", addr: "2001:db8::1", port: 5000.0, want: "[2001:db8::1]:5000"},
		{name: "port as string", addr: "192.0.2.1", port: "5000", want: "192.0.2.1:5000"},
		{name: "no port", addr: "192.0.2.1", want: "192.0.2.1"},
		{name: "no attributes", unset: true, want: ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fields := map[string]any{}
			if tc.addr != nil {
				fields["source.address"] = tc.addr
			}
			if tc.port != nil {
				fields["source.port"] = tc.port
			}
			attrs := attrsOf(t, fields)
			if tc.unset {
				attrs = nil
			}
			if got := peerFromAttributes(attrs); got != tc.want {
				t.Errorf("peer = %q, want %q", got, tc.want)
			}
		})
	}
}

func attrsOf(t *testing.T, fields map[string]any) map[string]*structpb.Struct {
	t.Helper()
	st, err := structpb.NewStruct(fields)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]*structpb.Struct{attributesKey: st}
}
