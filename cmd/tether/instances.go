package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
)

// defaultDrainWait is how long `tether instances drain` waits by default.
const defaultDrainWait = time.Minute

func instanceSubcommands() []subcommand {
	return []subcommand{
		{"list", "-s SERVICE", "list a service's instances with their state, health and slot usage", runInstancesList},
		{"drain", "-s SERVICE ID [--timeout D]", "set an instance draining and wait until it holds no session and no request", runInstancesDrain},
		{"state", "-s SERVICE ID active|standby|draining", "set an instance's administrative state", runInstancesState},
		{"health", "-s SERVICE ID healthy|unhealthy|unknown", "record an external health verdict (services without health checks; unknown clears it)", runInstancesHealth},
	}
}

// runInstances is `tether instances …`: the instance admin API of a running tether.
func runInstances(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runGroup(ctx, "instances", instanceSubcommands(), args, stdout, stderr)
}

func instancePath(service string, rest ...string) string {
	p := "/v1/services/" + url.PathEscape(service) + "/instances"
	for _, s := range rest {
		p += "/" + url.PathEscape(s)
	}
	return p
}

func runInstancesList(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	cmd := newAPICommand(name, instanceSubcommands(), stderr)
	c, _, err := cmd.parse(args, 0)
	if err != nil {
		return err
	}
	out := &tetherv1.ListInstancesResponse{}
	if err := c.Call(ctx, "GET", instancePath(cmd.service), nil, out); err != nil {
		return err
	}
	return cmd.print(stdout, out, func() error { return printInstances(stdout, out.GetInstances()) })
}

func runInstancesDrain(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	cmd := newAPICommand(name, instanceSubcommands(), stderr)
	timeout := cmd.fs.Duration("timeout", defaultDrainWait, "how long to wait for the instance to drain (0 = set draining and return)")
	pos, err := cmd.positional(args, 1)
	if err != nil {
		return err
	}
	if *timeout < 0 {
		return fmt.Errorf("--timeout %v is negative", *timeout)
	}
	c, err := cmd.client()
	if err != nil {
		return err
	}
	out := &tetherv1.DrainInstanceResponse{}
	if err := c.Call(ctx, "POST", instancePath(cmd.service, pos[0], "drain"), &tetherv1.DrainInstanceRequest{Timeout: durationpb.New(*timeout)}, out); err != nil {
		return err
	}
	err = cmd.print(stdout, out, func() error {
		if err := printInstances(stdout, []*tetherv1.Instance{out.GetInstance()}); err != nil {
			return err
		}
		if !out.GetDrained() {
			return nil
		}
		_, err := fmt.Fprintf(stdout, "instance %s of service %s is drained\n", pos[0], cmd.service)
		return err
	})
	if err != nil {
		return err
	}
	if !out.GetDrained() && *timeout > 0 {
		in := out.GetInstance()
		_, _ = fmt.Fprintf(stderr, "tether %s: instance %s of service %s is draining but not drained after %v (%d sessions, %d requests left)\n",
			name, pos[0], cmd.service, *timeout, in.GetSessions(), in.GetRequests())
		return exitError{1}
	}
	return nil
}

func runInstancesState(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	return putInstance(ctx, name, args, stdout, stderr, "state", "active, standby or draining", func(word string) (proto.Message, bool) {
		st, ok := tetherv1.InstanceState_value["INSTANCE_STATE_"+strings.ToUpper(word)]
		return &tetherv1.SetInstanceStateRequest{State: tetherv1.InstanceState(st)}, ok && st != 0
	})
}

func runInstancesHealth(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	return putInstance(ctx, name, args, stdout, stderr, "health", "healthy, unhealthy or unknown", func(word string) (proto.Message, bool) {
		h, ok := tetherv1.InstanceHealth_value["INSTANCE_HEALTH_"+strings.ToUpper(word)]
		return &tetherv1.SetInstanceHealthRequest{Health: tetherv1.InstanceHealth(h)}, ok && h != 0
	})
}

// putInstance is `tether instances state|health -s SERVICE ID WORD`: WORD parsed by parse into
// the request body PUT to the instance's what resource; the changed instance is printed.
func putInstance(ctx context.Context, name string, args []string, stdout, stderr io.Writer, what, want string, parse func(string) (proto.Message, bool)) error {
	cmd := newAPICommand(name, instanceSubcommands(), stderr)
	pos, err := cmd.positional(args, 2)
	if err != nil {
		return err
	}
	req, ok := parse(pos[1])
	if !ok {
		_, _ = fmt.Fprintf(stderr, "tether %s: %s %q: want %s\n", name, what, pos[1], want)
		return exitError{2}
	}
	c, err := cmd.client()
	if err != nil {
		return err
	}
	out := &tetherv1.Instance{}
	if err := c.Call(ctx, "PUT", instancePath(cmd.service, pos[0], what), req, out); err != nil {
		return err
	}
	return cmd.print(stdout, out, func() error { return printInstances(stdout, []*tetherv1.Instance{out}) })
}

// printInstances writes instances as a table; usage cells are "used/capacity".
func printInstances(w io.Writer, list []*tetherv1.Instance) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if _, err := fmt.Fprintln(tw, "ID\tADDRESS\tHTTP\tSIP\tWEIGHT\tZONE\tSTATE\tHEALTH\tSESSIONS\tREQUESTS"); err != nil {
		return err
	}
	port := func(p int32) string {
		if p == 0 {
			return "-"
		}
		return strconv.Itoa(int(p))
	}
	for _, in := range list {
		zone := in.GetZone()
		if zone == "" {
			zone = "-"
		}
		if _, err := fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%d/%d\t%d/%d\n", in.GetId(), in.GetAddress(), port(in.GetHttpPort()), port(in.GetSipPort()),
			in.GetWeight(), zone, enumWord(in.GetState().String(), "INSTANCE_STATE_"), enumWord(in.GetHealth().String(), "INSTANCE_HEALTH_"),
			in.GetSessions(), in.GetSessionCapacity(), in.GetRequests(), in.GetRequestCapacity()); err != nil {
			return err
		}
	}
	return tw.Flush()
}
