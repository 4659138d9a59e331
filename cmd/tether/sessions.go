package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tether-dev/tether/pkg/api/client"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
)

// defaultAPIAddr is the config file's default listeners.api.
const defaultAPIAddr = "127.0.0.1:9000"

// apiFlags are the flags every API subcommand shares.
type apiFlags struct {
	addr, token, output string
	// caFile, certFile and keyFile are the TLS files for an API served with tls (https://).
	caFile, certFile, keyFile string
}

func (f *apiFlags) register(fs *flag.FlagSet) {
	addr := os.Getenv("TETHER_ADDR")
	if addr == "" {
		addr = defaultAPIAddr
	}
	fs.StringVar(&f.addr, "addr", addr, "tether API `address` (host:port or URL; env TETHER_ADDR)")
	fs.StringVar(&f.token, "token", os.Getenv("TETHER_TOKEN"), "bearer `token` (env TETHER_TOKEN)")
	fs.StringVar(&f.caFile, "cacert", os.Getenv("TETHER_CACERT"), "PEM `file` of the CA that signed tether's certificate, for https (env TETHER_CACERT)")
	fs.StringVar(&f.certFile, "cert", os.Getenv("TETHER_CERT"), "client certificate PEM `file` for mutual TLS (env TETHER_CERT)")
	fs.StringVar(&f.keyFile, "key", os.Getenv("TETHER_KEY"), "client key PEM `file` for mutual TLS (env TETHER_KEY)")
	fs.StringVar(&f.output, "o", "table", "output `format`: table or json")
}

func (f *apiFlags) client() (*client.Client, error) {
	if f.output != "table" && f.output != "json" {
		return nil, fmt.Errorf("-o %q: want table or json", f.output)
	}
	opts := []client.Option{client.WithToken(f.token)}
	if f.caFile != "" || f.certFile != "" || f.keyFile != "" {
		cfg, err := f.tlsConfig()
		if err != nil {
			return nil, err
		}
		opts = append(opts, client.WithHTTPClient(&http.Client{Transport: &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}}))
	}
	c, err := client.New(f.addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("--addr: %w", err)
	}
	return c, nil
}

// tlsConfig builds the client TLS settings from -cacert, -cert and -key.
func (f *apiFlags) tlsConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.caFile != "" {
		pem, err := os.ReadFile(f.caFile)
		if err != nil {
			return nil, fmt.Errorf("-cacert: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-cacert %s: no PEM certificate", f.caFile)
		}
	}
	if (f.certFile == "") != (f.keyFile == "") {
		return nil, errors.New("-cert and -key go together")
	}
	if f.certFile != "" {
		pair, err := tls.LoadX509KeyPair(f.certFile, f.keyFile)
		if err != nil {
			return nil, fmt.Errorf("-cert/-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// printJSON writes msg as indented protojson (byte-stable).
func printJSON(w io.Writer, msg proto.Message) error {
	b, err := protojson.MarshalOptions{EmitDefaultValues: true}.Marshal(msg)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return err
	}
	out.WriteByte('\n')
	_, err = w.Write(out.Bytes())
	return err
}

// parseInterleaved parses flags that may come before, between or after positional arguments
// and returns the positional ones.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parseFlags(fs, args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// subcommand is one verb of a command group (sessions, instances).
type subcommand struct {
	name, synopsis, summary string
	run                     func(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error
}

// runGroup dispatches args[0] among subs.
func runGroup(ctx context.Context, group string, subs []subcommand, args []string, stdout, stderr io.Writer) error {
	groupUsage := func(w io.Writer) { // as usage, a failed write has nowhere to be reported
		var b strings.Builder
		fmt.Fprintf(&b, "usage: tether %s COMMAND [flags]\n\ncommands:\n", group)
		for _, s := range subs {
			fmt.Fprintf(&b, "  %-8s %s\n", s.name, s.summary)
		}
		fmt.Fprintf(&b, "\nrun \"tether %s COMMAND -h\" for a command's flags\n", group)
		_, _ = io.WriteString(w, b.String())
	}
	if len(args) == 0 {
		groupUsage(stderr)
		return exitError{2}
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		groupUsage(stdout)
		return nil
	}
	for _, s := range subs {
		if s.name == args[0] {
			return s.run(ctx, group+" "+s.name, args[1:], stdout, stderr)
		}
	}
	_, _ = fmt.Fprintf(stderr, "tether %s: unknown command %q\n\n", group, args[0])
	groupUsage(stderr)
	return exitError{2}
}

func sessionSubcommands() []subcommand {
	return []subcommand{
		{"list", "-s SERVICE [--status S] [--instance I] [--id ID] [--idle-longer-than D] [--limit N] [--page-token T] [--all]", "list a service's sessions", runSessionsList},
		{"get", "-s SERVICE ID", "show one session", runSessionsGet},
		{"create", "-s SERVICE [--id ID] [--ttl D] [--idle-timeout D] [--disable-reuse=BOOL] [--attr K=V]...", "create a session placed on an instance now", runSessionsCreate},
		{"update", "-s SERVICE ID [--ttl D] [--idle-timeout D] [--disable-reuse=BOOL]", "change an Active session's TTL, idle timeout or reuse flag", runSessionsUpdate},
		{"delete", "-s SERVICE ID", "end a session (the next request with its id starts a new one)", runSessionsDelete},
	}
}

// runSessions is `tether sessions …`: the SessionAPI of a running tether.
func runSessions(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runGroup(ctx, "sessions", sessionSubcommands(), args, stdout, stderr)
}

// apiCommand is the set-up every API subcommand shares: a flag set with the API flags and
// -s/--service. A subcommand adds its own flags to fs, then calls positional (and client) or parse.
type apiCommand struct {
	fs      *flag.FlagSet
	api     apiFlags
	service string
}

// newAPICommand returns the set-up for subcommand name ("group verb") of subs, whose synopsis
// the usage text shows.
func newAPICommand(name string, subs []subcommand, stderr io.Writer) *apiCommand {
	c := &apiCommand{fs: newFlagSet(name, synopsisOf(subs, name), stderr)}
	c.api.register(c.fs)
	c.fs.StringVar(&c.service, "s", "", "`service` name (required)")
	return c
}

// positional parses args (flags anywhere) and returns the positional arguments; without a
// service or with other than n positional arguments it prints the usage and exits 2.
func (c *apiCommand) positional(args []string, n int) ([]string, error) {
	pos, err := parseInterleaved(c.fs, args)
	if err != nil {
		return nil, err
	}
	switch {
	case c.service == "":
		return nil, usageError(c.fs, "-s SERVICE is required (the service to act on; tether status lists them)")
	case len(pos) != n:
		return nil, usageError(c.fs, "want %d argument(s) after the flags (see the usage line), got %d %q", n, len(pos), pos)
	}
	return pos, nil
}

// client checks -o and --addr and returns the API client.
func (c *apiCommand) client() (*client.Client, error) { return c.api.client() }

// parse is positional then client, for a subcommand with nothing of its own to check between.
func (c *apiCommand) parse(args []string, n int) (*client.Client, []string, error) {
	pos, err := c.positional(args, n)
	if err != nil {
		return nil, nil, err
	}
	cl, err := c.client()
	if err != nil {
		return nil, nil, err
	}
	return cl, pos, nil
}

// print writes msg as JSON with -o json, else calls table.
func (c *apiCommand) print(w io.Writer, msg proto.Message, table func() error) error {
	if c.api.output == "json" {
		return printJSON(w, msg)
	}
	return table()
}

// printSession writes s as JSON or as a one-row table.
func (c *apiCommand) printSession(w io.Writer, s *tetherv1.Session) error {
	return c.print(w, s, func() error { return printSessions(w, []*tetherv1.Session{s}) })
}

func synopsisOf(subs []subcommand, name string) string {
	i := slices.IndexFunc(subs, func(s subcommand) bool { return strings.HasSuffix(name, " "+s.name) })
	return subs[i].synopsis
}

func sessionPath(service string, id ...string) string {
	p := "/v1/services/" + url.PathEscape(service) + "/sessions"
	for _, s := range id {
		p += "/" + url.PathEscape(s)
	}
	return p
}

func runSessionsList(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	var status, instance, id, pageToken string
	var limit int
	var all bool
	cmd := newAPICommand(name, sessionSubcommands(), stderr)
	cmd.fs.StringVar(&status, "status", "", "only sessions with this `status`: Active, Expired or Terminated")
	cmd.fs.StringVar(&instance, "instance", "", "only sessions bound to this instance `id`")
	cmd.fs.StringVar(&id, "id", "", "only the session with this `id`")
	cmd.fs.IntVar(&limit, "limit", 0, "page size (server default 100, at most 1000)")
	cmd.fs.StringVar(&pageToken, "page-token", "", "start at this page `token` (from a previous page)")
	cmd.fs.BoolVar(&all, "all", false, "follow page tokens and list every matching session")
	var idle time.Duration
	cmd.fs.DurationVar(&idle, "idle-longer-than", 0, "only sessions not seen for longer than `D` (applied to the pages fetched: add --all for every session)")
	c, _, err := cmd.parse(args, 0)
	if err != nil {
		return err
	}
	out := &tetherv1.ListSessionsResponse{}
	for {
		q := url.Values{}
		for k, v := range map[string]string{"status": status, "instance": instance, "id": id, "pageToken": pageToken} {
			if v != "" {
				q.Set(k, v)
			}
		}
		if limit > 0 {
			q.Set("limit", strconv.Itoa(limit))
		}
		page := &tetherv1.ListSessionsResponse{}
		if err := c.Call(ctx, "GET", sessionPath(cmd.service)+"?"+q.Encode(), nil, page); err != nil {
			return err
		}
		for _, s := range page.GetSessions() {
			if idle > 0 && (s.GetLastSeenTime() == nil || time.Since(s.GetLastSeenTime().AsTime()) <= idle) {
				continue
			}
			out.Sessions = append(out.Sessions, s)
		}
		out.NextPageToken = page.GetNextPageToken()
		if pageToken = page.GetNextPageToken(); !all || pageToken == "" {
			break
		}
	}
	return cmd.print(stdout, out, func() error {
		if err := printSessions(stdout, out.GetSessions()); err != nil {
			return err
		}
		if out.GetNextPageToken() != "" {
			_, _ = fmt.Fprintf(stderr, "more sessions: --page-token %s (or --all)\n", out.GetNextPageToken())
		}
		return nil
	})
}

func runSessionsGet(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	cmd := newAPICommand(name, sessionSubcommands(), stderr)
	c, pos, err := cmd.parse(args, 1)
	if err != nil {
		return err
	}
	s := &tetherv1.Session{}
	if err := c.Call(ctx, "GET", sessionPath(cmd.service, pos[0]), nil, s); err != nil {
		return err
	}
	return cmd.printSession(stdout, s)
}

// attrs is a repeatable --attr K=V flag.
type attrs map[string]string

func (a attrs) String() string {
	keys := make([]string, 0, len(a))
	for k := range a {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		keys[i] = k + "=" + a[k]
	}
	return strings.Join(keys, ",")
}

func (a attrs) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return errors.New("want KEY=VALUE")
	}
	a[k] = val
	return nil
}

// optDuration is a duration flag that remembers whether it was given.
type optDuration struct{ d *time.Duration }

func (o *optDuration) String() string {
	if o == nil || o.d == nil {
		return ""
	}
	return o.d.String()
}

func (o *optDuration) Set(v string) error {
	d, err := time.ParseDuration(v)
	if err != nil {
		return err
	}
	o.d = &d
	return nil
}

func (o *optDuration) proto() *durationpb.Duration {
	if o.d == nil {
		return nil
	}
	return durationpb.New(*o.d)
}

// optBool is a boolean flag that remembers whether it was given.
type optBool struct{ b *bool }

func (o *optBool) String() string {
	if o == nil || o.b == nil {
		return ""
	}
	return strconv.FormatBool(*o.b)
}

func (o *optBool) Set(v string) error {
	b, err := strconv.ParseBool(v)
	if err != nil {
		return err
	}
	o.b = &b
	return nil
}

func (o *optBool) IsBoolFlag() bool { return true }

func runSessionsCreate(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	var id string
	var ttl, idle optDuration
	var reuse optBool
	at := attrs{}
	cmd := newAPICommand(name, sessionSubcommands(), stderr)
	cmd.fs.StringVar(&id, "id", "", "session `id` of your choice (header-field services only)")
	cmd.fs.Var(&ttl, "ttl", "total life, 1s..6h (default: the service's sessionTTL)")
	cmd.fs.Var(&idle, "idle-timeout", "idle timeout, 0..TTL (default: the service's idleTimeout)")
	cmd.fs.Var(&reuse, "disable-reuse", "refuse the id once the session ended (default: the service's disableSessionIdReuse)")
	cmd.fs.Var(at, "attr", "attribute `KEY=VALUE` stored with the session (repeatable)")
	c, _, err := cmd.parse(args, 0)
	if err != nil {
		return err
	}
	req := &tetherv1.CreateSessionRequest{SessionId: id, Ttl: ttl.proto(), IdleTimeout: idle.proto(), DisableSessionIdReuse: reuse.b}
	if len(at) > 0 {
		req.Attributes = at
	}
	s := &tetherv1.Session{}
	if err := c.Call(ctx, "POST", sessionPath(cmd.service), req, s); err != nil {
		return err
	}
	return cmd.printSession(stdout, s)
}

func runSessionsUpdate(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	var ttl, idle optDuration
	var reuse optBool
	cmd := newAPICommand(name, sessionSubcommands(), stderr)
	cmd.fs.Var(&ttl, "ttl", "new total life from creation, 1s..6h")
	cmd.fs.Var(&idle, "idle-timeout", "new idle timeout, 0..TTL")
	cmd.fs.Var(&reuse, "disable-reuse", "new reuse flag")
	pos, err := cmd.positional(args, 1)
	if err != nil {
		return err
	}
	if ttl.d == nil && idle.d == nil && reuse.b == nil {
		_, _ = fmt.Fprintln(stderr, "tether sessions update: nothing to change: give --ttl, --idle-timeout or --disable-reuse")
		return exitError{2}
	}
	c, err := cmd.client()
	if err != nil {
		return err
	}
	req := &tetherv1.UpdateSessionRequest{Ttl: ttl.proto(), IdleTimeout: idle.proto(), DisableSessionIdReuse: reuse.b}
	s := &tetherv1.Session{}
	if err := c.Call(ctx, "PATCH", sessionPath(cmd.service, pos[0]), req, s); err != nil {
		return endedSession(ctx, c, cmd.service, pos[0], "it can no longer be changed", err)
	}
	return cmd.printSession(stdout, s)
}

func runSessionsDelete(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	cmd := newAPICommand(name, sessionSubcommands(), stderr)
	c, pos, err := cmd.parse(args, 1)
	if err != nil {
		return err
	}
	resp := &tetherv1.DeleteSessionResponse{}
	if err := c.Call(ctx, "DELETE", sessionPath(cmd.service, pos[0]), nil, resp); err != nil {
		return endedSession(ctx, c, cmd.service, pos[0], "nothing to delete", err)
	}
	return cmd.print(stdout, resp, func() error {
		_, err := fmt.Fprintf(stdout, "session %s of service %s deleted\n", pos[0], cmd.service)
		return err
	})
}

// statusWords are the table's status cells.
var statusWords = map[tetherv1.SessionStatus]string{
	tetherv1.SessionStatus_SESSION_STATUS_ACTIVE:     "Active",
	tetherv1.SessionStatus_SESSION_STATUS_EXPIRED:    "Expired",
	tetherv1.SessionStatus_SESSION_STATUS_TERMINATED: "Terminated",
}

// enumWord turns AFFINITY_KIND_MCP_SSE into "mcp-sse".
func enumWord(name, prefix string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(name, prefix)), "_", "-")
}

func cellTime(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return t.AsTime().UTC().Format(time.RFC3339)
}

// printSessions writes sessions as a table.
func printSessions(w io.Writer, list []*tetherv1.Session) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if _, err := fmt.Fprintln(tw, "ID\tINSTANCE\tSTATUS\tKIND\tTTL\tIDLE\tREUSE\tCREATED\tLAST SEEN\tEXPIRES"); err != nil {
		return err
	}
	for _, s := range list {
		kind := enumWord(s.GetAffinityKind().String(), "AFFINITY_KIND_")
		status, ok := statusWords[s.GetStatus()]
		if !ok {
			status = s.GetStatus().String()
		}
		reuse := "yes"
		if s.GetDisableSessionIdReuse() {
			reuse = "no"
		}
		expires := cellTime(s.GetExpireTime())
		if s.GetEndTime() != nil {
			expires = "ended " + cellTime(s.GetEndTime())
		}
		if _, err := fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.GetId(), s.GetInstance(), status, kind,
			s.GetTtl().AsDuration(), s.GetIdleTimeout().AsDuration(), reuse,
			cellTime(s.GetCreateTime()), cellTime(s.GetLastSeenTime()), expires); err != nil {
			return err
		}
	}
	return tw.Flush()
}
