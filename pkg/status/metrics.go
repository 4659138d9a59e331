package status

import (
	"context"
	"errors"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tether-dev/tether/pkg/affinity"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/registry"
)

// Metrics is tether's Prometheus registry: a collector that renders one fresh snapshot per
// scrape, the decision latency histogram, the scale event counters, and the Go and process
// collectors. Names follow Prometheus conventions (base units, _total, _seconds).
type Metrics struct {
	reg       *prometheus.Registry
	decisions *prometheus.HistogramVec
	mcp       *prometheus.CounterVec
	outcomes  *Outcomes
}

// DecisionBuckets are the decision latency histogram's buckets, in seconds (50 µs to 1 s: an
// engine decision is microseconds; the top buckets catch store round trips).
var DecisionBuckets = []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1}

// NewMetrics returns the registry over a (and events, which may be nil). Decisions observed
// are also counted in outcomes when it is not nil (give the Assembler the same, WithOutcomes).
func NewMetrics(a *Assembler, events *Events, outcomes *Outcomes) *Metrics {
	m := &Metrics{
		outcomes: outcomes,
		reg:      prometheus.NewRegistry(),
		decisions: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tether_decision_duration_seconds",
			Help:    "Time the engine took to decide a request (ext_proc and SIP), by service, affinity mode and outcome (admitted, a rejection class, or error).",
			Buckets: DecisionBuckets,
		}, []string{LabelService, "affinity", "outcome"}),
		mcp: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_mcp_requests_total",
			Help: "MCP requests decided, by service, MCP method (the Mcp-Method header; methods outside the MCP specification count as \"other\") and outcome.",
		}, []string{LabelService, "method", "outcome"}),
	}
	m.reg.MustRegister(m.decisions, m.mcp,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&snapshotCollector{a: a, events: events})
	return m
}

// Handler serves the metrics in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// Registry returns the Prometheus registry (to add collectors).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Outcome is the outcome label of a decision's result.
func Outcome(err error) string {
	if err == nil {
		return "admitted"
	}
	var rej *affinity.Reject
	if errors.As(err, &rej) {
		return rej.Class.String()
	}
	return "error"
}

// ObserveDecision records one decision's latency.
func (m *Metrics) ObserveDecision(service string, mode registry.AffinityMode, outcome string, d time.Duration) {
	m.decisions.WithLabelValues(service, string(mode), outcome).Observe(d.Seconds())
	if m.outcomes != nil {
		m.outcomes.Add(service, outcome)
	}
}

// Decider is the engine as the ext_proc server and the SIP handler use it.
type Decider interface {
	Decide(ctx context.Context, req affinity.Request) (affinity.Decision, error)
}

// TimedDecider wraps d so that every decision is observed in the latency histogram; reg gives
// each service's affinity mode. A request that matched no service of the registry — none at
// all, or a name the client made up (x-tether-service, a SIP decide path) — is labelled
// service "", so a client cannot grow the label set.
//
// A decision costs one clock pair and a lock-free lookup of its pre-resolved histogram and
// outcome count (per service, outcome and registry snapshot): no label hashing per decision.
func (m *Metrics) TimedDecider(d Decider, reg *registry.Registry) Decider {
	return &timedDecider{d: d, m: m, reg: reg}
}

type timedDecider struct {
	d   Decider
	m   *Metrics
	reg *registry.Registry
	// cells: decisionKey → *decisionCell, re-resolved when the registry snapshot changes (a
	// service's affinity mode is a label).
	cells sync.Map
	// mcp: mcpKey → prometheus.Counter.
	mcp sync.Map
}

type decisionKey struct{ service, outcome string }

// decisionCell is one (service, outcome)'s histogram and count, resolved under snap.
type decisionCell struct {
	snap  *registry.Snapshot
	obs   prometheus.Observer
	count func() // Outcomes.Add for the pair, or nothing
}

type mcpKey struct{ service, method, outcome string }

func (t *timedDecider) Decide(ctx context.Context, req affinity.Request) (affinity.Decision, error) {
	start := time.Now()
	dec, err := t.d.Decide(ctx, req)
	elapsed := time.Since(start)
	service := req.Service
	if err == nil && service == "" {
		service = dec.Instance().Service
	}
	outcome := Outcome(err)
	if _, known := t.reg.Snapshot().Service(service); !known {
		service = ""
	}
	c := t.cell(service, outcome)
	c.obs.Observe(elapsed.Seconds())
	c.count()
	if method := req.Header("mcp-method"); method != "" {
		t.mcpCounter(service, MCPMethod(method), outcome).Inc()
	}
	return dec, err
}

// cell returns the pre-resolved histogram and count of (service, outcome).
func (t *timedDecider) cell(service, outcome string) *decisionCell {
	snap := t.reg.Snapshot()
	k := decisionKey{service, outcome}
	if c, ok := t.cells.Load(k); ok && c.(*decisionCell).snap == snap {
		return c.(*decisionCell)
	}
	var mode registry.AffinityMode
	svc, known := snap.Service(service)
	if known {
		mode = svc.Affinity
	}
	c := &decisionCell{snap: snap, obs: t.m.decisions.WithLabelValues(service, string(mode), outcome), count: func() {}}
	if t.m.outcomes != nil {
		n := t.m.outcomes.counter(service, outcome)
		c.count = func() { n.Add(1) }
	}
	t.cells.Store(k, c) // service is "" or one of the registry's
	return c
}

func (t *timedDecider) mcpCounter(service, method, outcome string) prometheus.Counter {
	k := mcpKey{service, method, outcome}
	if c, ok := t.mcp.Load(k); ok {
		return c.(prometheus.Counter)
	}
	c := t.m.mcp.WithLabelValues(service, method, outcome)
	t.mcp.Store(k, c)
	return c
}

// mcpMethods are the request and notification methods of the MCP specification (2024-11-05
// to 2026-07-28): the values the method label may take.
var mcpMethods = map[string]bool{
	"initialize": true, "ping": true, "server/discover": true, "subscriptions/listen": true,
	"tools/list": true, "tools/call": true, "prompts/list": true, "prompts/get": true,
	"resources/list": true, "resources/read": true, "resources/templates/list": true,
	"resources/subscribe": true, "resources/unsubscribe": true, "completion/complete": true,
	"logging/setLevel": true, "sampling/createMessage": true, "elicitation/create": true,
	"roots/list": true, "tasks/get": true, "tasks/list": true, "tasks/result": true, "tasks/cancel": true,
	"notifications/initialized": true, "notifications/cancelled": true, "notifications/progress": true,
	"notifications/message": true, "notifications/roots/list_changed": true,
	"notifications/resources/updated": true, "notifications/resources/list_changed": true,
	"notifications/tools/list_changed": true, "notifications/prompts/list_changed": true,
	"notifications/elicitation/complete": true, "notifications/tasks/status": true,
}

// MCPMethod is the metric label of an Mcp-Method header: the method when the MCP specification
// defines it, else "other" (a client chooses the header, so the label set stays bounded).
func MCPMethod(m string) string {
	if mcpMethods[m] {
		return m
	}
	return "other"
}

// The labels naming a tether service and instance. They are never "service" or "instance":
// Prometheus attaches instance and job to every scraped series, and the Prometheus Operator
// service, namespace, pod, container and endpoint; a target label wins over a scraped label of
// the same name (renamed exported_instance, …) unless honor_labels is set. No tether label takes
// any of those names.
const (
	LabelService  = "tether_service"
	LabelInstance = "tether_instance"
)

// snapshotCollector renders one snapshot per scrape.
type snapshotCollector struct {
	a      *Assembler
	events *Events
}

var (
	descDesired        = prometheus.NewDesc("tether_service_desired_instances", "Scale-out gauge: instances holding sessions, plus one when every instance in use is full.", []string{LabelService}, nil)
	descActual         = prometheus.NewDesc("tether_service_actual_instances", "Instances in use now: healthy active ones and healthy standby ones holding sessions (scale-out's); compare with tether_service_desired_instances.", []string{LabelService}, nil)
	descSessions       = prometheus.NewDesc("tether_instance_sessions", "Sessions bound to the instance (session slots in use).", []string{LabelService, LabelInstance}, nil)
	descSessionSlots   = prometheus.NewDesc("tether_instance_session_slots", "Session slots of the instance (sessionsPerInstance).", []string{LabelService, LabelInstance}, nil)
	descRequests       = prometheus.NewDesc("tether_instance_requests", "Requests in flight on the instance (request slots in use).", []string{LabelService, LabelInstance}, nil)
	descRequestSlots   = prometheus.NewDesc("tether_instance_request_slots", "Request slots of the instance (requestSlotsPerInstance).", []string{LabelService, LabelInstance}, nil)
	descHealthy        = prometheus.NewDesc("tether_instance_healthy", "1 unless the instance fails its health checks.", []string{LabelService, LabelInstance}, nil)
	descState          = prometheus.NewDesc("tether_instance_state", "1 for the instance's administrative state (active, standby or draining).", []string{LabelService, LabelInstance, "state"}, nil)
	descWeight         = prometheus.NewDesc("tether_instance_weight", "The instance's balancing weight.", []string{LabelService, LabelInstance}, nil)
	descScaleEvents    = prometheus.NewDesc("tether_scale_events_total", "Autoscaling signals emitted, by service and kind (scale-out, scale-in).", []string{LabelService, "kind"}, nil)
	descOpenStreams    = prometheus.NewDesc("tether_extproc_open_streams", "ext_proc streams being served now.", nil, nil)
	descStreams        = prometheus.NewDesc("tether_extproc_streams_total", "ext_proc streams served since start.", nil, nil)
	descDecisions      = prometheus.NewDesc("tether_extproc_decisions_total", "Requests the engine admitted through ext_proc.", nil, nil)
	descRejects        = prometheus.NewDesc("tether_extproc_rejects_total", "Requests the engine refused through ext_proc, by rejection class.", []string{"class"}, nil)
	descEngineErrors   = prometheus.NewDesc("tether_extproc_engine_errors_total", "Decide failures that were not rejections (answered 500).", nil, nil)
	descProtocolErrors = prometheus.NewDesc("tether_extproc_protocol_errors_total", "ext_proc streams ended for breaking the protocol.", nil, nil)
	descMismatches     = prometheus.NewDesc("tether_extproc_served_host_mismatches_total", "Responses whose served host (selected_host_key) differs from tether's choice.", nil, nil)
	descLearned        = prometheus.NewDesc("tether_extproc_sse_sessions_learned_total", "MCP SSE session ids learned from endpoint events.", nil, nil)
	descLearnFailures  = prometheus.NewDesc("tether_extproc_sse_learn_failures_total", "SSE streams whose session id could not be learned.", nil, nil)
	descExtProcDrain   = prometheus.NewDesc("tether_extproc_draining", "1 while the ext_proc server drains for shutdown.", nil, nil)
	descXDSGeneration  = prometheus.NewDesc("tether_xds_generation", "Registry generation the xDS snapshots reflect.", nil, nil)
	descXDSPublishes   = prometheus.NewDesc("tether_xds_publishes_total", "xDS rebuilds that published a change.", nil, nil)
	descXDSFailing     = prometheus.NewDesc("tether_xds_publish_failing", "1 when the last xDS rebuild failed (the previous config is still served).", nil, nil)
	descXDSNACKs       = prometheus.NewDesc("tether_xds_nacks_total", "Configurations xDS clients rejected.", nil, nil)
	descXDSStreams     = prometheus.NewDesc("tether_xds_streams", "Open ADS streams.", nil, nil)
	descXDSNodes       = prometheus.NewDesc("tether_xds_nodes", "xDS clients known (connected or recently seen).", nil, nil)
	descSrcSynced      = prometheus.NewDesc("tether_discovery_source_synced", "1 once the instance source (config, api, or a discovery source) delivered a complete set.", []string{"source", "kind"}, nil)
	descSrcFailing     = prometheus.NewDesc("tether_discovery_source_failing", "1 while the source's last refresh failed (its last good set stays in use).", []string{"source", "kind"}, nil)
	descSrcInstances   = prometheus.NewDesc("tether_discovery_source_instances", "Instances the source declares.", []string{"source", "kind"}, nil)
	descSrcShadowed    = prometheus.NewDesc("tether_discovery_source_shadowed_instances", "The source's instances hidden by a source of higher precedence with the same id.", []string{"source", "kind"}, nil)
	descSrcErrors      = prometheus.NewDesc("tether_discovery_source_errors_total", "Failed refreshes of the source since start.", []string{"source", "kind"}, nil)
	descInstStreams    = prometheus.NewDesc("tether_instance_streams", "Long-lived MCP streams open on the instance (stream slots in use).", []string{LabelService, LabelInstance}, nil)
	descInstStreamCap  = prometheus.NewDesc("tether_instance_stream_slots", "Stream slots of the instance (streamsPerInstance); 0 where streams count as requests.", []string{LabelService, LabelInstance}, nil)
	descInstCalls      = prometheus.NewDesc("tether_instance_calls", "SIP calls the instance carries (decided, not ended), by state (setup, answered); services with calls.track.", []string{LabelService, LabelInstance, "state"}, nil)
	descSrcLastSync    = prometheus.NewDesc("tether_discovery_source_last_sync_timestamp_seconds", "When the source last delivered a set (Unix time).", []string{"source", "kind"}, nil)
)

func (c *snapshotCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDesired, descActual, descSessions, descSessionSlots, descRequests,
		descRequestSlots, descHealthy, descState, descWeight, descScaleEvents, descOpenStreams, descStreams,
		descDecisions, descRejects, descEngineErrors, descProtocolErrors, descMismatches, descLearned,
		descLearnFailures, descExtProcDrain, descXDSGeneration, descXDSPublishes, descXDSFailing, descXDSNACKs,
		descXDSStreams, descXDSNodes, descSrcSynced, descSrcFailing, descSrcInstances, descSrcShadowed, descSrcErrors,
		descSrcLastSync, descInstStreams, descInstStreamCap, descInstCalls} {
		ch <- d
	}
}

func (c *snapshotCollector) Collect(ch chan<- prometheus.Metric) {
	Render(c.a.Snapshot(), c.events, ch)
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// A gauge writes one gauge sample.
type gauge func(d *prometheus.Desc, v float64, labels ...string)

// renderInstance writes the gauges of one instance of service.
func renderInstance(g gauge, service string, in *tetherv1.Instance) {
	l := []string{service, in.GetId()}
	g(descSessions, float64(in.GetSessions()), l...)
	g(descSessionSlots, float64(in.GetSessionCapacity()), l...)
	g(descRequests, float64(in.GetRequests()), l...)
	g(descRequestSlots, float64(in.GetRequestCapacity()), l...)
	if in.GetStreamCapacity() > 0 {
		g(descInstStreams, float64(in.GetStreams()), l...)
		g(descInstStreamCap, float64(in.GetStreamCapacity()), l...)
	}
	if in.GetCalls() > 0 || in.GetCallCapacity() > 0 {
		g(descInstCalls, float64(in.GetCalls()-in.GetCallsAnswered()), service, in.GetId(), "setup")
		g(descInstCalls, float64(in.GetCallsAnswered()), service, in.GetId(), "answered")
	}
	g(descHealthy, boolGauge(in.GetHealth() != tetherv1.InstanceHealth_INSTANCE_HEALTH_UNHEALTHY), l...)
	g(descWeight, float64(in.GetWeight()), l...)
	for _, st := range []tetherv1.InstanceState{tetherv1.InstanceState_INSTANCE_STATE_ACTIVE,
		tetherv1.InstanceState_INSTANCE_STATE_STANDBY, tetherv1.InstanceState_INSTANCE_STATE_DRAINING} {
		g(descState, boolGauge(in.GetState() == st), service, in.GetId(), Word(st.String(), "INSTANCE_STATE_"))
	}
}

// Render writes the metrics of one snapshot (and the event counters, if events is not nil).
func Render(s *tetherv1.Status, events *Events, ch chan<- prometheus.Metric) {
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	ctr := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	for _, svc := range s.GetServices() {
		g(descDesired, float64(svc.GetDesiredInstances()), svc.GetName())
		g(descActual, float64(svc.GetActualInstances()), svc.GetName())
		for _, in := range svc.GetInstances() {
			renderInstance(g, svc.GetName(), in)
		}
	}
	for _, src := range s.GetSources() {
		l := []string{src.GetName(), src.GetKind()}
		g(descSrcSynced, boolGauge(src.GetSynced()), l...)
		g(descSrcFailing, boolGauge(src.GetFailing()), l...)
		g(descSrcInstances, float64(src.GetInstances()), l...)
		g(descSrcShadowed, float64(src.GetShadowed()), l...)
		ctr(descSrcErrors, src.GetErrors(), l...)
		if ts := src.GetLastSync(); ts != nil {
			g(descSrcLastSync, float64(ts.AsTime().UnixNano())/1e9, l...)
		}
	}
	if events != nil {
		counts := events.Counts()
		keys := make([][2]string, 0, len(counts))
		for k := range counts {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool { return keys[i][0]+"\x00"+keys[i][1] < keys[j][0]+"\x00"+keys[j][1] })
		for _, k := range keys {
			ctr(descScaleEvents, counts[k], k[0], k[1])
		}
	}
	if e := s.GetExtProc(); e != nil {
		g(descOpenStreams, float64(e.GetOpenStreams()))
		ctr(descStreams, e.GetStreams())
		ctr(descDecisions, e.GetDecisions())
		for class, n := range e.GetRejects() {
			ctr(descRejects, n, class)
		}
		ctr(descEngineErrors, e.GetEngineErrors())
		ctr(descProtocolErrors, e.GetProtocolErrors())
		ctr(descMismatches, e.GetServedHostMismatches())
		ctr(descLearned, e.GetSseSessionsLearned())
		ctr(descLearnFailures, e.GetSseLearnFailures())
		g(descExtProcDrain, boolGauge(e.GetDraining()))
	}
	if x := s.GetXds(); x != nil {
		g(descXDSGeneration, float64(x.GetGeneration()))
		ctr(descXDSPublishes, x.GetPublishes())
		g(descXDSFailing, boolGauge(x.GetLastError() != ""))
		ctr(descXDSNACKs, x.GetNacks())
		streams := 0
		for _, n := range x.GetNodes() {
			streams += int(n.GetStreams())
		}
		g(descXDSStreams, float64(streams))
		g(descXDSNodes, float64(len(x.GetNodes())))
	}
}
