package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/status"
)

// runStatus is `tether status`: the operator snapshot of a running tether as tables; -w
// redraws it every --interval until interrupted.
func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("status", "[-w] [--interval D] [--addr A] [--token T] [-o table|json]", stderr)
	var f apiFlags
	f.register(fs)
	watch := fs.Bool("w", false, "watch: redraw every --interval until interrupted")
	interval := fs.Duration("interval", 2*time.Second, "redraw interval with -w")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError(fs, "unexpected arguments %q", fs.Args())
	}
	if *interval <= 0 {
		return usageError(fs, "--interval %v: want a positive duration", *interval)
	}
	c, err := f.client()
	if err != nil {
		return err
	}
	for {
		st := &tetherv1.Status{}
		if err := c.Call(ctx, "GET", "/v1/status", nil, st); err != nil {
			return err
		}
		if f.output == "json" {
			if err := printJSON(stdout, st); err != nil {
				return err
			}
		} else {
			var b strings.Builder
			if *watch {
				b.WriteString("\x1b[H\x1b[2J") // home and clear, as watch(1) does
			}
			if err := printStatus(&b, st); err != nil {
				return err
			}
			if _, err := io.WriteString(stdout, b.String()); err != nil {
				return err
			}
		}
		if !*watch {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(*interval):
		}
	}
}

// printStatus writes the snapshot as tables: services, instances, xDS nodes, recent events.
func printStatus(w io.Writer, st *tetherv1.Status) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	// Every string from the snapshot goes out escaped: node ids and NACK texts are the
	// clients' own, and a raw ESC or other control byte would drive the operator's terminal.
	p := func(format string, a ...any) {
		for i, v := range a {
			if s, ok := v.(string); ok {
				a[i] = terminalSafe(s)
			}
		}
		_, _ = fmt.Fprintf(tw, format, a...)
	}
	p("tether status at %s (generation %d)\n\n", cellTime(st.GetTime()), st.GetGeneration())
	p("SERVICE\tAFFINITY\tDESIRED\tACTUAL\tINSTANCES\n")
	for _, s := range st.GetServices() {
		p("%s\t%s\t%d\t%d\t%d\n", s.GetName(), s.GetAffinity(), s.GetDesiredInstances(), s.GetActualInstances(), len(s.GetInstances()))
	}
	p("\nSERVICE\tINSTANCE\tSTATE\tHEALTH\tWEIGHT\tSESSIONS\tREQUESTS\n")
	for _, s := range st.GetServices() {
		for _, in := range s.GetInstances() {
			p("%s\t%s\t%s\t%s\t%d\t%d/%d\t%d/%d\n", s.GetName(), in.GetId(),
				status.Word(in.GetState().String(), "INSTANCE_STATE_"), status.Word(in.GetHealth().String(), "INSTANCE_HEALTH_"),
				in.GetWeight(), in.GetSessions(), in.GetSessionCapacity(), in.GetRequests(), in.GetRequestCapacity())
		}
	}
	if r := st.GetStore(); r != nil {
		p("\nredis: %s, %s, %s\n", map[bool]string{true: "reachable", false: "UNREACHABLE"}[r.GetReachable()],
			map[bool]string{true: "DEGRADED (admitting within the request slots held)", false: "not degraded"}[r.GetDegraded()], epochLine(r))
	}
	printExtProc(p, st.GetExtProc())
	printXDS(p, st.GetXds())
	if ev := st.GetEvents(); len(ev) > 0 {
		p("\nTIME\tEVENT\tSERVICE\tINSTANCE\tDESIRED\n")
		for _, e := range ev[max(0, len(ev)-10):] {
			p("%s\t%s\t%s\t%s\t%d\n", cellTime(e.GetTime()), status.Word(e.GetKind().String(), "SCALE_EVENT_KIND_"), e.GetService(), e.GetInstance(), e.GetDesiredInstances())
		}
	}
	return tw.Flush()
}

// epochLine says whether this replica met Redis losing its data, and what clients saw.
func epochLine(r *tetherv1.StoreStatus) string {
	if r.GetEpochChanges() == 0 {
		return "no data loss seen (epoch unchanged since start)"
	}
	return fmt.Sprintf("DATA LOST %d time(s), last at %s: sessions made before were lost (clients got new ones); no new request slots lent until %s",
		r.GetEpochChanges(), cellTime(r.GetLastEpochChangeTime()), cellTime(r.GetLearningUntil()))
}

// A printer writes one formatted line (or part) of the status tables.
type printer func(format string, a ...any)

// printExtProc writes the ext_proc line, if the snapshot has one.
func printExtProc(p printer, e *tetherv1.ExtProcStatus) {
	if e == nil {
		return
	}
	var rejects []string
	for _, class := range []string{"TooManyRequests", "NoCapacity", "NotFound", "BadRequest", "Conflict", "NoService", "Other"} {
		if n := e.GetRejects()[class]; n > 0 {
			rejects = append(rejects, fmt.Sprintf("%s=%d", class, n))
		}
	}
	p("\next_proc: %d open streams, %d streams, %d admitted, rejected: %s\n", e.GetOpenStreams(), e.GetStreams(), e.GetDecisions(), orNone(strings.Join(rejects, " ")))
}

// printXDS writes the xDS line and its nodes' table, if the snapshot has them.
func printXDS(p printer, x *tetherv1.XdsStatus) {
	if x == nil {
		return
	}
	failing := "ok"
	if x.GetLastError() != "" {
		failing = "FAILING: " + x.GetLastError()
	}
	p("\nxDS: generation %d, %d publishes, %d NACKs, publish %s\n", x.GetGeneration(), x.GetPublishes(), x.GetNacks(), failing)
	if len(x.GetNodes()) == 0 {
		return
	}
	p("NODE\tSNAPSHOT\tSTREAMS\tLAST ACK\tLAST NACK\n")
	for _, n := range x.GetNodes() {
		nack := "-"
		if k := n.GetLastNack(); k != nil {
			nack = cellTime(k.GetTime()) + " " + k.GetMessage()
		}
		p("%s\t%s\t%d\t%s\t%s\n", n.GetId(), n.GetSnapshot(), n.GetStreams(), cellTime(n.GetLastAck()), nack)
	}
}

// terminalSafe escapes what a terminal would act on or a table would break at: C0 and C1
// control characters, DEL, and invalid UTF-8 (as Go escapes: \x1b, \u009b), and a backslash
// before them stays unambiguous by being escaped too.
func terminalSafe(s string) string {
	clean := true
	for _, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == utf8.RuneError || r == '\\' {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	q := strconv.QuoteToGraphic(s)
	return q[1 : len(q)-1]
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
