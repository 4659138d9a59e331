package extproc

import "testing"

// FuzzSSEScannerSplits feeds an event stream to the endpoint scanner in one chunk and again
// split at the positions the fuzzer picks: both must find the same endpoint event (or none).
// The scan limit is above the input, so giving up never depends on the split.
func FuzzSSEScannerSplits(f *testing.F) {
	for _, s := range []string{
		"event: endpoint\ndata: /messages/?sessionId=abc\n\n",
		"\xEF\xBB\xBFevent:endpoint\r\ndata:/m?session_id=1\r\n\r\n",
		": comment\revent: endpoint\rdata: a\rdata: b\r\r",
		"event: message\ndata: x\n\nevent: endpoint\ndata: /m?sessionid=2\n\n",
		"data: no type\n\n", "event: endpoint\n\n", "\xEF\xBBevent: endpoint\ndata: x\n\n",
	} {
		f.Add([]byte(s), []byte{3, 1, 7})
	}
	f.Fuzz(func(t *testing.T, stream, cuts []byte) {
		limit := len(stream) + 1
		whole, wholeFound, _ := newSSEScanner(limit).feed(stream)
		s := newSSEScanner(limit)
		var data string
		found := false
		rest := stream
		for i := 0; !found && len(rest) > 0; i++ {
			n := len(rest)
			if i < len(cuts) {
				n = min(int(cuts[i])%(len(rest)+1), len(rest))
			}
			data, found, _ = s.feed(rest[:n])
			rest = rest[n:]
		}
		if found != wholeFound || data != whole {
			t.Fatalf("one chunk: %q found=%v; split by %v: %q found=%v", whole, wholeFound, cuts, data, found)
		}
	})
}
