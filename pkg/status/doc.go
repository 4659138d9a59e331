// Package status assembles tether's operator view — one snapshot (tetherv1.Status) of every
// service with its instances' session and request slots, health, state and weight, desired vs
// actual instances, recent scale-out and scale-in events, the ext_proc counters and the xDS
// clients with their last ACK/NACK — and renders it: as Prometheus metrics (Collector), to
// the operator endpoints (/v1/status, the gRPC StatusService, the dashboard's SSE stream, in
// pkg/api), and to autoscalers (Webhook).
//
// The snapshot is the one type every view reads, so /v1/status, /metrics and the dashboard
// cannot disagree: each scrape or request assembles a fresh one (Assembler.Snapshot) from the
// registry, the engine's slot usage and the servers' counters.
//
// Scale events: the engine reports scale-out (a session opened a standby instance) through its
// scale-out hook (Events.ScaleOut); Events.WatchScaleIn reports scale-in when an instance that
// held sessions has been empty for a configured time. Both go to the recent-events ring that
// the snapshot carries and to every subscriber (the webhook sender).
//
// Every type here is safe for concurrent use.
package status
