package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"

	"github.com/tether-dev/tether/pkg/api/client"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
)

// The API's messages naming an unknown service or session (two wordings for a service: the
// engine's and the registry's), reworded once here so the CLI says one thing for one error.
var (
	unknownServiceRe = regexp.MustCompile(`service "([^"]*)"(?:: unknown service| not found)`)
	noSessionRe      = regexp.MustCompile(`session "([^"]*)": session not found`)
)

// explain turns an API call's error into one that says what happened and what to do: tether
// not reachable, a token refused, an unknown service or session. Other errors pass unchanged.
func explain(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) && (ue.Timeout() || isDialError(ue.Err)) {
		where := ue.URL
		if u, perr := url.Parse(ue.URL); perr == nil {
			where = u.Scheme + "://" + u.Host
		}
		return fmt.Errorf("cannot reach tether at %s: %w (is it running? -addr or TETHER_ADDR names the API listener)", where, innermost(ue.Err))
	}
	var ae *client.Error
	if !errors.As(err, &ae) {
		return err
	}
	switch ae.Status {
	case http.StatusUnauthorized:
		return fmt.Errorf("the API refused the token (401 %s): pass -token or set TETHER_TOKEN to one of auth.tokens", ae.Message)
	case http.StatusForbidden:
		return fmt.Errorf("the token may not do this (403): %s", ae.Message)
	case http.StatusNotFound:
		if m := noSessionRe.FindStringSubmatch(ae.Message); m != nil {
			return fmt.Errorf("no session %q: never created, or purged after it ended (tether sessions list -s SERVICE shows the ones kept)", m[1])
		}
		if m := unknownServiceRe.FindStringSubmatch(ae.Message); m != nil {
			return fmt.Errorf("unknown service %q (tether status lists the services)", m[1])
		}
	}
	return err
}

// endedSession explains err of a change to session id: when the session has ended it fetches
// it and says how and when ("expired at …"), and why that stops the change (what).
func endedSession(ctx context.Context, c *client.Client, service, id, what string, err error) error {
	var ae *client.Error
	if !errors.As(err, &ae) || ae.Code != "FailedPrecondition" || !strings.Contains(ae.Message, "session ended") && !strings.Contains(ae.Message, "session expired") {
		return err
	}
	s := &tetherv1.Session{}
	if c.Call(ctx, "GET", sessionPath(service, id), nil, s) != nil || s.GetEndTime() == nil {
		return fmt.Errorf("session %q of service %s has already ended: %s", id, service, what)
	}
	how := map[tetherv1.SessionStatus]string{
		tetherv1.SessionStatus_SESSION_STATUS_EXPIRED:    "expired",
		tetherv1.SessionStatus_SESSION_STATUS_TERMINATED: "was terminated",
	}[s.GetStatus()]
	if how == "" {
		how = "ended"
	}
	return fmt.Errorf("session %q of service %s %s at %s: %s", id, service, how, s.GetEndTime().AsTime().UTC().Format("2006-01-02T15:04:05Z"), what)
}

// isDialError reports whether err is a failure to connect (refused, no route, unknown host).
func isDialError(err error) bool {
	var oe *net.OpError
	var de *net.DNSError
	return errors.As(err, &oe) && oe.Op == "dial" || errors.As(err, &de)
}

// innermost is the last error of err's Unwrap chain ("connection refused").
func innermost(err error) error {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err
		}
		err = next
	}
}
