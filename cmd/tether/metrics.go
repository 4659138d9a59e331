package main

import (
	"bytes"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// metricsHandler serves tether's counters and gauges in the Prometheus text exposition format
// (version 0.0.4): ext_proc decisions, rejections by class, served-host mismatches, open
// streams, per-instance session and request slots, the scale-out gauge per service, and the
// xDS publish state. Every scrape reads fresh values; output order is stable.
func (rt *services) metricsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		var b bytes.Buffer
		m := promWriter{&b}
		if rt.extProc != nil {
			st := rt.extProc.Stats()
			m.metric("tether_extproc_open_streams", "gauge", "ext_proc streams being served now.", float64(st.OpenStreams))
			m.metric("tether_extproc_streams_total", "counter", "ext_proc streams served since start.", float64(st.Streams))
			m.metric("tether_extproc_decisions_total", "counter", "Requests the engine admitted.", float64(st.Decisions))
			m.header("tether_extproc_rejects_total", "counter", "Requests the engine refused, by class.")
			for _, r := range []struct {
				class string
				n     uint64
			}{
				{"bad_request", st.Rejects.BadRequest}, {"not_found", st.Rejects.NotFound}, {"conflict", st.Rejects.Conflict},
				{"too_many_requests", st.Rejects.TooManyRequests}, {"no_capacity", st.Rejects.NoCapacity},
				{"no_service", st.Rejects.NoService}, {"other", st.Rejects.Other},
			} {
				m.sample("tether_extproc_rejects_total", float64(r.n), "class", r.class)
			}
			m.metric("tether_extproc_engine_errors_total", "counter", "Decide failures that were not rejections.", float64(st.EngineErrors))
			m.metric("tether_extproc_protocol_errors_total", "counter", "Streams ended for breaking the ext_proc protocol.", float64(st.ProtocolErrors))
			m.metric("tether_extproc_served_host_mismatches_total", "counter", "Responses whose served host (selected_host_key) differs from tether's choice.", float64(st.ServedHostMismatches))
			m.metric("tether_extproc_sse_sessions_learned_total", "counter", "MCP SSE session ids learned from endpoint events.", float64(st.SessionsLearned))
			m.metric("tether_extproc_sse_learn_failures_total", "counter", "SSE streams whose session id could not be learned.", float64(st.LearnFailures))
		}
		if rt.xds != nil {
			ps := rt.xds.Stats()
			m.metric("tether_xds_generation", "gauge", "Registry generation the xDS snapshots reflect.", float64(ps.Generation))
			m.metric("tether_xds_publishes_total", "counter", "xDS rebuilds that published a change.", float64(ps.Publishes))
			failing := 0.0
			if ps.LastError != nil {
				failing = 1
			}
			m.metric("tether_xds_publish_failing", "gauge", "1 when the last xDS rebuild failed (the previous config is still served).", failing)
		}

		snap := rt.registry.Snapshot()
		m.header("tether_service_desired_instances", "gauge", "Scale-out gauge: instances holding sessions, plus one when every instance in use is full.")
		for _, svc := range snap.Services() {
			m.sample("tether_service_desired_instances", float64(rt.engine.DesiredInstances(svc.Name)), "service", svc.Name)
		}
		type slot struct {
			name, help string
			value      func(sessions, sessionCap, requests, requestCap int) int
		}
		slots := []slot{
			{"tether_instance_sessions", "Sessions bound to the instance (session slots in use).", func(s, _, _, _ int) int { return s }},
			{"tether_instance_session_slots", "Session slots of the instance (sessionsPerInstance).", func(_, c, _, _ int) int { return c }},
			{"tether_instance_requests", "Requests in flight on the instance (request slots in use).", func(_, _, r, _ int) int { return r }},
			{"tether_instance_request_slots", "Request slots of the instance (requestSlotsPerInstance).", func(_, _, _, c int) int { return c }},
		}
		for _, s := range slots {
			m.header(s.name, "gauge", s.help)
			for _, svc := range snap.Services() {
				usage, err := rt.engine.Usage(svc.Name)
				if err != nil {
					continue
				}
				for _, u := range usage {
					m.sample(s.name, float64(s.value(u.Sessions, u.SessionCap, u.Requests, u.RequestCap)),
						"service", svc.Name, "instance", u.Instance.ID)
				}
			}
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = w.Write(b.Bytes())
	})
}

// promWriter writes the Prometheus text format.
type promWriter struct{ b *bytes.Buffer }

func (p promWriter) header(name, kind, help string) {
	fmt.Fprintf(p.b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, kind)
}

// sample writes one sample; labels are name/value pairs.
func (p promWriter) sample(name string, v float64, labels ...string) {
	p.b.WriteString(name)
	if len(labels) > 0 {
		p.b.WriteByte('{')
		for i := 0; i+1 < len(labels); i += 2 {
			if i > 0 {
				p.b.WriteByte(',')
			}
			p.b.WriteString(labels[i])
			p.b.WriteString(`="`)
			p.b.WriteString(labelEscaper.Replace(labels[i+1]))
			p.b.WriteByte('"')
		}
		p.b.WriteByte('}')
	}
	p.b.WriteByte(' ')
	p.b.WriteString(strconv.FormatFloat(v, 'g', -1, 64))
	p.b.WriteByte('\n')
}

func (p promWriter) metric(name, kind, help string, v float64) {
	p.header(name, kind, help)
	p.sample(name, v)
}

var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
