package sipp_test

import (
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-dev/tether/internal/sipp"
)

func TestParseMessageLog(t *testing.T) {
	log := "----------------------------------------------- 2026-01-01 10:00:00.000001\n" +
		"UDP message received [120] bytes :\n\n" +
		"INVITE sip:user1@127.0.0.1:5060 SIP/2.0\nVia: SIP/2.0/UDP 127.0.0.1\nCall-ID: 1-99@127.0.0.1\nCSeq: 1 INVITE\n\nv=0\n\n" +
		"----------------------------------------------- 2026-01-01 10:00:00.000002\n" +
		"UDP message sent (40 bytes):\n\nSIP/2.0 180 Ringing\nCall-ID: 1-99@127.0.0.1\n\n\n" +
		"----------------------------------------------- 2026-01-01 10:00:00.000003\n" +
		"UDP message received [60] bytes :\n\nSIP/2.0 200 OK\ni: compact@h\n\n" +
		"----------------------------------------------- 2026-01-01 10:00:00.000004\n" +
		"UDP message received [60] bytes :\n\nBYE sip:x SIP/2.0\nTo: <sip:x>\ncall-id:  2-99@127.0.0.1 \n\n"
	got := sipp.ParseMessageLog([]byte(log))
	type short struct{ Method, StartLine, CallID string }
	var gotShort []short
	for _, m := range got {
		gotShort = append(gotShort, short{m.Method, m.StartLine, m.CallID})
	}
	want := []short{
		{"INVITE", "INVITE sip:user1@127.0.0.1:5060 SIP/2.0", "1-99@127.0.0.1"},
		{"", "SIP/2.0 200 OK", "compact@h"},
		{"BYE", "BYE sip:x SIP/2.0", "2-99@127.0.0.1"},
	}
	if diff := cmp.Diff(want, gotShort); diff != "" {
		t.Errorf("messages (-want +got):\n%s", diff)
	}
}

// TestUACToUAS runs the harness's scenarios against each other directly (no proxy): every
// call's INVITE, ACK and BYE reach the UAS.
func TestUACToUAS(t *testing.T) {
	sipp.Require(t)
	uas := sipp.StartUAS(t, "direct")
	res := sipp.RunUAC(t, sipp.UACOptions{Target: "127.0.0.1:" + strconv.Itoa(uas.Port), Service: "user", Calls: 5, Rate: 20})
	if res.ExitCode != 0 {
		t.Fatalf("UAC exit code %d\nerrors:\n%s\noutput:\n%s", res.ExitCode, res.Errors, res.Output)
	}
	msgs, err := uas.Received()
	if err != nil {
		t.Fatal(err)
	}
	methods := map[string][]string{}
	for _, m := range msgs {
		methods[m.CallID] = append(methods[m.CallID], m.Method)
	}
	if len(methods) != 5 {
		t.Fatalf("UAS saw %d calls, want 5: %v", len(methods), methods)
	}
	for cid, ms := range methods {
		if diff := cmp.Diff([]string{"INVITE", "ACK", "BYE"}, ms); diff != "" {
			t.Errorf("call %s (-want +got):\n%s", cid, diff)
		}
	}
}
