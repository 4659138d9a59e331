package main

import (
	"context"
	"fmt"
	"io"
	"net/url"

	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
)

func ringSubcommands() []subcommand {
	return []subcommand{
		{"lookup", "-s SERVICE [--sip] KEY", "name the instance a hash key maps to now (like Kamailio's dispatcher.hash)", runRingLookup},
	}
}

// runRing is `tether ring …`: the consistent-hash ring of a running tether.
func runRing(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runGroup(ctx, "ring", ringSubcommands(), args, stdout, stderr)
}

func runRingLookup(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	cmd := newAPICommand(name, ringSubcommands(), stderr)
	sip := cmd.fs.Bool("sip", false, "look the key up on the SIP ring (key: the DCR rule's, or fromtag:callid); default HTTP (the DCR rule's, or the peer host:port)")
	c, pos, err := cmd.parse(args, 1)
	if err != nil {
		return err
	}
	q := url.Values{"key": {pos[0]}}
	if *sip {
		q.Set("protocol", "sip")
	}
	out := &tetherv1.LookupRingResponse{}
	if err := c.Call(ctx, "GET", "/v1/services/"+url.PathEscape(cmd.service)+"/ring?"+q.Encode(), nil, out); err != nil {
		return err
	}
	return cmd.print(stdout, out, func() error {
		in := out.GetInstance()
		_, err := fmt.Fprintf(stdout, "%s %s key %q -> %s (%s, http %d, sip %d)\n", cmd.service,
			enumWord(out.GetProtocol().String(), "RING_PROTOCOL_"), out.GetKey(), in.GetId(), in.GetAddress(), in.GetHttpPort(), in.GetSipPort())
		return err
	})
}
