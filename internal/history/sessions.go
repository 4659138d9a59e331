package history

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// SessionOp kinds.
const (
	OpCreate = "create"
	OpEnd    = "end"
)

// SessionResult is what a session write answered.
type SessionResult int

// The results a client can tell apart.
const (
	// Done: the write was applied (create: the session exists now; end: it ended it).
	Done SessionResult = iota
	// Refused: the write was refused by the state (create: the id exists; end: not active).
	Refused
	// Unknown: the store did not answer (unavailable, timed out): applied or not.
	Unknown
)

type sessionOp struct {
	key, kind string
	client    int
	call, ret time.Duration
	res       SessionResult
}

// Sessions records session writes for CheckSessions. Safe for concurrent use.
type Sessions struct {
	r  *Recorder
	mu sync.Mutex
	op []sessionOp
}

// Sessions returns a session-write history on the recorder's clock.
func (r *Recorder) Sessions() *Sessions { return &Sessions{r: r} }

// Call marks a write's invocation and returns what records its answer.
func (s *Sessions) Call(client int, key, kind string) func(SessionResult) {
	call := s.r.Now()
	return func(res SessionResult) {
		ret := s.r.Now()
		s.mu.Lock()
		s.op = append(s.op, sessionOp{key: key, kind: kind, client: client, call: call, ret: ret, res: res})
		s.mu.Unlock()
	}
}

// Len returns how many writes were recorded.
func (s *Sessions) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.op)
}

// session states of the model
const (
	absent = iota
	active
	ended
)

// sessionModel: per key, a session is absent, active or ended. A create is applied only to an
// absent or ended id (a reused id) and refused on an existing one; an end is applied only to an
// active one and refused otherwise; an unknown answer may have been applied or not.
var sessionModel = porcupine.NondeterministicModel{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		var keys []string
		for _, o := range h {
			k := o.Input.(sessionOp).key
			if _, ok := by[k]; !ok {
				keys = append(keys, k)
			}
			by[k] = append(by[k], o)
		}
		slices.Sort(keys)
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, by[k])
		}
		return out
	},
	Init: func() []interface{} { return []interface{}{absent} },
	Step: func(state, input, output interface{}) []interface{} {
		st, in, res := state.(int), input.(sessionOp), output.(SessionResult)
		var applies bool
		var next int
		switch in.kind {
		case OpCreate:
			applies, next = st == absent || st == ended, active
		case OpEnd:
			applies, next = st == active, ended
		}
		switch {
		case res == Unknown && applies:
			return []interface{}{st, next}
		case res == Unknown:
			return []interface{}{st}
		case res == Done && applies:
			return []interface{}{next}
		case res == Refused && !applies:
			return []interface{}{st}
		}
		return nil
	},
	Equal: func(a, b interface{}) bool { return a == b },
}

// CheckSessions checks that the recorded writes are linearizable per key (porcupine), an
// unknown answer counting as a write that may have taken effect at any time after its call.
func (s *Sessions) CheckSessions(timeout time.Duration) error {
	s.mu.Lock()
	ops := make([]porcupine.Operation, 0, len(s.op))
	for _, o := range s.op {
		ret := int64(o.ret)
		if o.res == Unknown {
			ret = math.MaxInt64 // it may take effect any time later
		}
		ops = append(ops, porcupine.Operation{ClientId: o.client, Input: o, Call: int64(o.call), Output: o.res, Return: ret})
	}
	s.mu.Unlock()
	switch porcupine.CheckOperationsTimeout(sessionModel.ToModel(), ops, timeout) {
	case porcupine.Ok:
		return nil
	case porcupine.Illegal:
		return fmt.Errorf("history: session writes are not linearizable (%d writes)", len(ops))
	default:
		return fmt.Errorf("history: the linearizability check of %d session writes did not finish within %v", len(ops), timeout)
	}
}
