// Package quota shares each instance's request slots among tether replicas with leases on
// Redis (Doorman-style), so that requestSlotsPerInstance holds across every replica together
// without a store round trip per request.
//
// # The invariant
//
// For every instance, at every instant, the exchanges admitted through all replicas together
// and still in flight (with those a stopping replica handed off to Envoy) number at most the
// cap — whatever Redis does (an outage of any length, a hang, a restart with or without its
// data, a failover to a replica that missed writes; for handed-off exchanges, see rule 5's
// exception), whatever one replica's wall clock says, and whichever replica is cut off from
// Redis alone.
// It rests on five rules (the fifth with one exception, stated there):
//
//  1. Redis records a replica's slots before the replica spends them, and the replica stops
//     spending them before Redis forgets them. Redis keeps a lease for the hold,
//     max(leaseTTL, degradedFor), from the moment its script runs, by Redis's own clock
//     (redis.call('TIME'): the one clock). The replica may admit on the lease until
//     sent + hold − margin on its own monotonic clock, where sent is when it sent the call
//     that granted or renewed it (before Redis could have run it). Its wall clock is never
//     read for that, so a replica whose clock is off by any amount changes nothing.
//  2. A record covers the exchanges, not only the admissions: every call re-asserts
//     max(lease, in use), so a replica that lost its lease (cut off past the hold) counts its
//     exchanges still in flight against the cap again as soon as it reaches Redis; and at its
//     fence (sent + hold − margin without a renewal) a replica tells every exchange it still
//     has on the lapsed lease to end (Fenced; the engine's sweeper resets them), margin before
//     Redis may lend their slots to anyone else.
//  3. Fencing: every record carries the epoch of the data set it was granted in. The epoch is
//     a key that exists only while Redis's data set is continuous (Redis restarted empty, a
//     key evicted, or — unless WithTrustRestarts — any other Redis process answering: a
//     restart from a lossy AOF, a failover to a replica that may have missed writes). A new
//     epoch starts a learning window of one hold, and each replica whose lease carries an
//     older epoch stops admitting on it and re-acquires it under the new epoch (re-asserting
//     what it still may spend and what is in flight). What it still may spend is its claim:
//     a part of the old epoch's slots, which summed to at most the cap. During the window
//     Redis lends only what re-asserting replicas claimed and have given back since
//     (Σ claims − Σ leases of the new epoch): whatever the replicas it has not heard from
//     still spend is at most cap − Σ claims, so that much is free by the old cap. Nothing
//     else is lent, since Redis cannot tell how much of the rest a replica cut off from it
//     may still spend until its fence (no bound short of one hold exists: Redis's uptime
//     does not bound the last grant after a failover, and a cut-off replica's lease is known
//     only to itself). After the window every lease of the old epoch has passed its fence,
//     so what was not re-asserted is free. Each record also carries the
//     replica's call sequence number: a call Redis runs late (queued during a stall, on a
//     connection the replica gave up) cannot undo a later one.
//  4. Fairness does not trade safety: when a replica's demand (in use plus refused) exceeds its
//     lease, the others are lent only what is left after what the starved replicas are owed up
//     to their shares of the cap (in proportion to demand), and each learns its share as its
//     admission target; idle excess above it goes back within a return round. Nothing admitted
//     is revoked for fairness.
//  5. An exchange that goes on without its replica (handed off to Envoy at shutdown) keeps
//     its slot as a detached hold (Pool.Detach): a record of its own that every replica
//     counts against the cap until it expires, whatever the epoch, and that no replica can
//     end early. The replica adds it only while Redis still holds the replica's lease, with
//     that slot in it, under the current epoch (the script checks; locally, before the
//     fence), and then takes the slot out of its lease: so Σ leases + Σ live holds never
//     exceeds what Redis granted, and the slot is counted at every instant, first in the
//     lease, then in the hold (for a moment in both). The hold lasts from when its script
//     runs, by Redis's clock, for the longest the exchange can still last plus the margin:
//     its service's maxLifetime from its start, which Envoy enforces as the route's
//     max_stream_duration (timed from the downstream request's start, before tether's
//     decision). An exchange without that bound (maxLifetime 0) is never detached: it stays
//     with its replica. Because the holds are records of their own, a stopping replica
//     still clears its lease record at once (what it gives back excludes the holds), and
//     the holds outlive it. During a learning window holds count as taken too (what is lent
//     is Σ claims − Σ leases − Σ holds). No hold is added while replicas of e11d6a0 share
//     the Redis (protocol 1: their script does not count holds). Not covered: (a) a Redis
//     that loses its data (restarted empty, a failover to a replica that missed the write)
//     loses the holds with it, and nobody else knows them: once the new epoch's learning
//     window is over (one hold), the slots of exchanges handed off before the loss and still
//     in flight can be lent again, up to one per lost hold, until those exchanges end (at
//     most maxLifetime); a Redis that restarts with its data (AOF or RDB) keeps them, even
//     when that starts a new epoch. (b) Holds added before a replica of e11d6a0 connected
//     are not counted by it, nor by the protocol-1 script, until they expire.
//
// # How
//
// Records live under the service's hash tag, so one script runs on one Cluster slot:
//
//	P{svc}:L:<inst>  hash: replica → "slots,demand,epoch,seq,claim" (claim: what it re-asserted of an older epoch)
//	P{svc}:lx        zset: "<inst>|<replica>" → when Redis forgets the record (ms, Redis time)
//	P{svc}:qe        string: "epoch id,start (ms, Redis time),run id": the data set's epoch
//	P{svc}:D:<inst>  zset: "<replica>|<n>" → when the detached hold expires (ms, Redis time);
//	                 the key itself expires (PEXPIREAT) with its last hold
//
// While replicas of e11d6a0 share the Redis (pkg/protocol), the records are written in its
// format, replica → slots, with its script (lease_e11d6a0.go); a record in that format counts
// as a lease of the current epoch until it lapses.
//
// A request is admitted locally while the replica's slots in use are below its lease and its
// fair target (one compare-and-swap: no round trip). When its lease is used up the replica
// borrows another chunk (one round trip, only then, bounded by the call timeout); idle excess
// goes back every 250 ms — what is kept is a chunk above the most slots in use at once over
// the last second (not above what a round happens to find in use: short exchanges come and go
// between rounds), so the lease a replica holds when Redis goes away covers its recent demand;
// leases are renewed every leaseTTL/3.
//
// # Faults (what a replica does; measured in the faults note)
//
//   - Redis unreachable or hung (degraded mode): the replica keeps admitting within the lease
//     it holds — never more — until its fence, sent + hold − margin after its last renewal;
//     it returns nothing while Redis is away. A latency breaker (WithCallTimeout, default a
//     quarter of Envoy's message_timeout) makes a request wait at most one call timeout for
//     Redis, and then none at all until a background call gets through. At the fence it stops
//     admitting and ends the exchanges still on the lease. Recovery is automatic.
//   - A replica killed: its slots stay taken until Redis forgets its records, one hold after
//     its last renewal (so degradedFor is also how long a dead replica's slots are lost to the
//     others). Its exchanges were reset by Envoy with its side streams.
//   - Redis restarted empty or failed over: a learning window of one hold (rule 3): replicas
//     keep spending what they held; only what they give back of it is lent again (to any
//     replica), nothing beyond it. A busy instance whose replicas held less than their demand
//     refuses the excess (429) until the window ends. A first start on an empty Redis is the
//     same, unless Seed marks the data set fresh.
//   - A partition of one replica alone: as Redis unreachable, for that replica only; the
//     others cannot lend its slots until its fence has passed.
//
// Leases, Pool and every method are safe for concurrent use.
package quota
