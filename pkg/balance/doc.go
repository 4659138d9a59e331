// Package balance holds tether's per-instance capacity accounting and its balancing algorithms:
// session and request slots (Slots, Ticket), the seed placement rule for new sessions (Place),
// weighted round robin (RoundRobin), weighted least request (LeastRequest) and weighted Maglev
// consistent hashing with optional bounded load (Maglev, Hash).
//
// Everything here is pure Go with no Envoy, gRPC or registry types: callers describe instances
// by index into their own slices (weights, ids) and answer "is instance i usable?" and "what is
// instance i's load?" through callbacks, so health, state and load stay owned by the engine.
// All exported types are safe for concurrent use unless their documentation says otherwise.
package balance
