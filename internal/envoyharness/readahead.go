package envoyharness

import (
	"errors"
	"io"
	"sync/atomic"
	"time"
)

// bufferLimit is how much of a response body the harness holds while the response_headers
// answer is pending, like Envoy's default per-connection buffer limit (1 MiB) before it stops
// reading from the upstream.
const bufferLimit = 1 << 20

// readAhead reads a response body on its own goroutine while the response_headers answer is
// pending, as Envoy keeps receiving (and buffering) data meanwhile, so the harness can tell
// whether the whole body had arrived when the answer came (ProcessorState::
// isLastResponseAfterHeaderResp: completeBodyAvailable). It is the body's only reader; Read
// hands out what it buffered, in order.
type readAhead struct {
	chunks chan []byte
	err    error       // the body's final error (io.EOF at its end); set before done closes
	eof    atomic.Bool // the body ended while buffered data may still be unread
	done   chan struct{}
	cur    []byte
}

func newReadAhead(body io.Reader) *readAhead {
	ra := &readAhead{chunks: make(chan []byte, bufferLimit/(32<<10)), done: make(chan struct{})}
	go func() {
		defer close(ra.done)
		defer close(ra.chunks)
		for {
			buf := make([]byte, 32<<10)
			n, err := body.Read(buf)
			if n > 0 {
				ra.chunks <- buf[:n]
			}
			if err != nil {
				ra.err = err
				ra.eof.Store(true)
				return
			}
		}
	}()
	return ra
}

// complete reports whether the whole body has arrived (and ended without error).
func (ra *readAhead) complete() bool {
	if !ra.eof.Load() {
		return false
	}
	<-ra.done
	return errors.Is(ra.err, io.EOF)
}

// waitComplete waits until the body ended, the buffer is full or wait passed, then reports
// complete.
func (ra *readAhead) waitComplete(wait time.Duration) bool {
	t := time.NewTimer(wait)
	defer t.Stop()
	for !ra.eof.Load() && len(ra.chunks) < cap(ra.chunks) {
		select {
		case <-ra.done:
		case <-t.C:
			return ra.complete()
		case <-time.After(time.Millisecond):
		}
	}
	return ra.complete()
}

// Read implements io.Reader over the buffered chunks, then the body's final error.
func (ra *readAhead) Read(p []byte) (int, error) {
	for len(ra.cur) == 0 {
		c, ok := <-ra.chunks
		if !ok {
			<-ra.done
			return 0, ra.err
		}
		ra.cur = c
	}
	n := copy(p, ra.cur)
	ra.cur = ra.cur[n:]
	return n, nil
}
