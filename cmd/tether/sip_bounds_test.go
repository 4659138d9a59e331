package main

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSIPDecideCutsOffSlowBodies is the regression test for the SIP finding of issue 14 (a
// slow body was held for over 30 s): a client that sends its headers and then trickles the
// body is answered or disconnected once sipReadTimeout has passed; an oversized body is
// refused. The SIP listener is the only one that runs here.
func TestSIPDecideCutsOffSlowBodies(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "tether.yaml")
	writeFile(t, path, "apiVersion: tether/v1\nregistry: {allowedNetworks: [127.0.0.1/32]}\nlisteners: {api: '', extProc: '', xds: '', sip: 127.0.0.1:0}\n"+
		"services: [{name: voice, affinity: hash, instances: [{id: a, address: 127.0.0.1, ports: {sip: 5060}}]}]\n")
	info := serveFor(t, path).serveInfo // serve's own error is checked when the test ends

	conn, err := net.Dial("tcp", info.sipAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	start := time.Now()
	if _, err := conn.Write([]byte("POST /v1/sip/voice/decide HTTP/1.1\r\nHost: x\r\nContent-Type: application/sip\r\nContent-Length: 4000\r\n\r\nINVITE sip:")); err != nil {
		t.Fatal(err)
	}
	// Keep trickling a byte now and then, as a slow-loris client does, until the server
	// gives up on us.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := conn.Write([]byte("x")); err != nil {
					return
				}
			}
		}
	}()
	if err := conn.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	elapsed := time.Since(start)
	if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the slow body was still held after %v", elapsed)
	}
	if err == nil {
		_ = resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Errorf("the slow request got %d", resp.StatusCode)
		}
	}
	if elapsed < sipReadTimeout-time.Second || elapsed > 3*sipReadTimeout {
		t.Errorf("cut off after %v, want about sipReadTimeout (%v)", elapsed, sipReadTimeout)
	}

	big := "INVITE sip:b@x SIP/2.0\r\nX-Pad: " + strings.Repeat("a", 70<<10) + "\r\n\r\n"
	r, err := http.Post("http://"+info.sipAddr+"/v1/sip/voice/decide", "application/sip", strings.NewReader(big))
	if err != nil {
		t.Fatal(err)
	}
	_ = r.Body.Close()
	if r.StatusCode != http.StatusRequestEntityTooLarge && r.StatusCode != http.StatusBadRequest {
		t.Errorf("a 70 KiB body: %d, want 413 or 400", r.StatusCode)
	}
}
