// Command tether is tether's one binary: it serves Envoy ext_proc and xDS, the SessionAPI and
// the SIP decision endpoint (serve), checks config files (validate) and more; run
// `tether help` for the list.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// command is one subcommand. run gets the arguments after the command name; it prints its own
// output and returns nil (exit 0), an exitError (that code, nothing more printed) or another
// error (printed as "tether NAME: error", exit 1).
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

// commands is the command table. To add a subcommand, write its run function in its own file
// (cmd/tether/NAME.go) and add one line here.
func commands() []command {
	return []command{
		{"serve", "run tether with a config file (-c FILE) until SIGINT/SIGTERM; SIGHUP reloads", runServe},
		{"validate", "check config files (-c FILE...) and list every problem", runValidate},
		{"bootstrap", "print an Envoy bootstrap for a config file (-c FILE)", runBootstrap},
		{"version", "print the version", runVersion},
		{"sessions", "list, get, create, update and delete sessions of a running tether (HTTP/JSON API)", runSessions},
		{"instances", "list instances, set their state and drain them on a running tether", runInstances},
		{"status", "show a running tether's services, instances, slots, xDS nodes and scale events (-w to watch)", runStatus},
		{"redis", "seed -c FILE: mark a new Redis as new, so that a fleet's first start lends request slots at once", runRedis},
		{"ring", "look up which instance a hash key maps to on a running tether (ring lookup -s SERVICE KEY)", runRing},
	}
}

// exitError ends the process with code after the command has printed what went wrong.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// run dispatches args to a command and returns the process exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		usage(stdout)
		return 0
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, args[1:], stdout, stderr)
		var exit exitError
		switch {
		case err == nil, errors.Is(err, flag.ErrHelp):
			return 0
		case errors.As(err, &exit):
			return exit.code
		default:
			_, _ = fmt.Fprintf(stderr, "tether %s: %v\n", c.name, explain(err))
			return 1
		}
	}
	_, _ = fmt.Fprintf(stderr, "tether: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

// usage writes the command list to w in one write. A failed write is not reported: there is
// nowhere else to report it.
func usage(w io.Writer) {
	var b strings.Builder
	b.WriteString("usage: tether COMMAND [flags]\n\ncommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(&b, "  %-10s %s\n", c.name, c.summary)
	}
	b.WriteString("\nrun \"tether COMMAND -h\" for a command's flags\n")
	_, _ = io.WriteString(w, b.String())
}

// newFlagSet returns a flag set for a command that reports parse errors to stderr.
func newFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("tether "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		_, _ = fmt.Fprintf(stderr, "usage: tether %s %s\n", name, synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// usageError reports a missing or wrong argument of the command fs parses — what is wrong,
// then the usage — and exits 2.
func usageError(fs *flag.FlagSet, format string, a ...any) error {
	_, _ = fmt.Fprintf(fs.Output(), "%s: %s\n", fs.Name(), fmt.Sprintf(format, a...))
	fs.Usage()
	return exitError{2}
}

// parseFlags parses args; a mistake (already reported by the flag package) exits 2.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return exitError{2}
	}
	return nil
}

// parseConfigArgs parses args for a command that takes one config file (-c) and no arguments:
// a missing -c is a usage error saying what the file is for (why), an argument is one too.
func parseConfigArgs(fs *flag.FlagSet, args []string, path *string, why string) error {
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *path == "" {
		return usageError(fs, "-c FILE is required (%s)", why)
	}
	if fs.NArg() > 0 {
		return usageError(fs, "unexpected arguments %q", fs.Args())
	}
	return nil
}

// files is a repeatable -c flag.
type files []string

func (f *files) String() string     { return fmt.Sprint(*f) }
func (f *files) Set(v string) error { *f = append(*f, v); return nil }
