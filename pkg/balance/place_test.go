package balance_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-dev/tether/pkg/balance"
)

type placement struct {
	Idx      int
	ScaleOut bool
	OK       bool
}

func place(c []balance.Candidate) placement {
	i, s, ok := balance.Place(c)
	return placement{i, s, ok}
}

func active(sessions, cap int) balance.Candidate {
	return balance.Candidate{Active: true, Sessions: sessions, SessionCap: cap}
}

func standby(sessions, cap int) balance.Candidate {
	return balance.Candidate{Standby: true, Sessions: sessions, SessionCap: cap}
}

func TestPlace(t *testing.T) {
	tests := []struct {
		name string
		c    []balance.Candidate
		want placement
	}{
		{"prefer the fullest with room", []balance.Candidate{active(1, 5), active(3, 5), active(5, 5), active(0, 5)}, placement{1, false, true}},
		{"ties go to the lowest index", []balance.Candidate{active(0, 5), active(2, 5), active(2, 5)}, placement{1, false, true}},
		{"cold start takes the first", []balance.Candidate{active(0, 2), active(0, 2)}, placement{0, false, true}},
		{"empty active before standby", []balance.Candidate{active(2, 2), standby(1, 2), active(0, 2)}, placement{2, false, true}},
		{"over-full active is skipped", []balance.Candidate{active(7, 5), active(1, 5)}, placement{1, false, true}},
		{"scale out to standby when every active is full", []balance.Candidate{active(2, 2), standby(0, 2), active(2, 2)}, placement{1, true, true}},
		{"fill the used standby first", []balance.Candidate{active(2, 2), standby(0, 3), standby(2, 3), standby(3, 3)}, placement{2, true, true}},
		{"only standbys", []balance.Candidate{standby(0, 1)}, placement{0, true, true}},
		{"active flag wins over standby", []balance.Candidate{{Active: true, Standby: true, SessionCap: 1}, standby(0, 1)}, placement{0, false, true}},
		{"neither flag is ignored", []balance.Candidate{{SessionCap: 5}, active(1, 1)}, placement{-1, false, false}},
		{"cap 0 never takes a session", []balance.Candidate{active(0, 0), standby(0, 0)}, placement{-1, false, false}},
		{"no capacity", []balance.Candidate{active(2, 2), standby(1, 1), active(3, 2)}, placement{-1, false, false}},
		{"no candidates", nil, placement{-1, false, false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, place(tt.c)); diff != "" {
				t.Errorf("Place (-want +got):\n%s", diff)
			}
		})
	}
}

// Seed scenario 1 with 2 sessions per instance: Client1 and Client2 bind to Instance1, Client3
// lands on Instance2 — as an active instance (no scale-out signal) or as a standby (scale-out).
func TestPlaceSeedScenario1(t *testing.T) {
	for _, tc := range []struct {
		name         string
		second       balance.Candidate
		wantScaleOut []bool
	}{
		{"instance 2 active", active(0, 2), []bool{false, false, false}},
		{"instance 2 standby", standby(0, 2), []bool{false, false, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := []balance.Candidate{active(0, 2), tc.second}
			var got []placement
			for range 3 { // Client1, Client2, Client3
				p := place(c)
				got = append(got, p)
				if p.OK {
					c[p.Idx].Sessions++
				}
			}
			want := []placement{{0, tc.wantScaleOut[0], true}, {0, tc.wantScaleOut[1], true}, {1, tc.wantScaleOut[2], true}}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("placements (-want +got):\n%s", diff)
			}
			// Client4 fills Instance2; Client5 finds no capacity.
			if p := place(c); p.Idx != 1 || !p.OK {
				t.Errorf("Client4: %+v, want instance index 1", p)
			}
			c[1].Sessions++
			if p := place(c); p.OK {
				t.Errorf("Client5: %+v, want no capacity", p)
			}
		})
	}
}
