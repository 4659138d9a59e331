package history

import (
	"testing"
	"time"
)

// TestCheckCapCountsCertainOverlaps: intervals that certainly overlap count; one that merely
// touches another does not.
func TestCheckCapCountsCertainOverlaps(t *testing.T) {
	r := New()
	r.slots = []Slot{
		{Resource: "i1", Client: "a", Admitted: 1, Released: 5},
		{Resource: "i1", Client: "b", Admitted: 2, Released: 4},
		{Resource: "i1", Client: "c", Admitted: 5, Released: Open}, // touches a's end
	}
	peaks, err := r.CheckCap(func(string) int { return 2 })
	if err != nil || peaks[0].Max != 2 {
		t.Fatalf("peaks %+v, err %v; want a peak of 2 within the cap", peaks, err)
	}
	if _, err := r.CheckCap(func(string) int { return 1 }); err == nil {
		t.Fatal("a peak of 2 passed a cap of 1")
	}
}

// TestCheckSessionsFindsAViolation: two creates of one id that both succeed with no end
// between them are not linearizable; with an unknown end between them, or an unknown first
// create, they are.
func TestCheckSessionsFindsAViolation(t *testing.T) {
	at := func(s *Sessions, client int, key, kind string, call, ret time.Duration, res SessionResult) {
		s.op = append(s.op, sessionOp{key: key, kind: kind, client: client, call: call, ret: ret, res: res})
	}
	bad := New().Sessions()
	at(bad, 0, "x", OpCreate, 0, 1, Done)
	at(bad, 1, "x", OpCreate, 2, 3, Done)
	at(bad, 1, "y", OpCreate, 2, 3, Done)
	if err := bad.CheckSessions(time.Second); err == nil {
		t.Error("two applied creates of one id passed")
	}
	ok := New().Sessions()
	at(ok, 0, "x", OpCreate, 0, 1, Done)
	at(ok, 2, "x", OpEnd, 1, 2, Unknown)
	at(ok, 1, "x", OpCreate, 3, 4, Done)
	at(ok, 1, "x", OpEnd, 5, 6, Done)
	at(ok, 0, "x", OpEnd, 7, 8, Refused)
	if err := ok.CheckSessions(time.Second); err != nil {
		t.Error(err)
	}
}
