package sipdecide

import (
	"encoding/base64"
	"fmt"
	"net/http"

	"github.com/tether-dev/tether/pkg/affinity"
)

// In-dialog failover. A decision asked with "?token=1" answers the SIP URI with a ";tk=" URI
// parameter: a token of the call's hash key (base64url, no padding), which the proxy stamps into
// its Record-Route. When an in-dialog request cannot reach the dialog's instance, the proxy
// POSTs the token to PathPrefix + "{service}/failover" and gets the instance the key maps to
// now (the next live instance on the ring once the dead one is unhealthy), in the same answer
// format. The token is a key, not an instance: a client that forges one chooses a key, as it
// already can through the fields a key is extracted from, never an instance.
//
// Failing a dialog over is correct only when the application replicates dialog state between
// instances; examples/converged/kamailio.cfg enables it only with WITH_DIALOG_FAILOVER.
const (
	failoverAction = "failover"
	// TokenParam is the URI parameter that carries the token in a decision's answer.
	TokenParam = "tk"
	// maxToken bounds a failover token, in bytes.
	maxToken = 1024
)

// hashKeyed is implemented by the engine's hash decisions.
type hashKeyed interface{ HashKey() string }

func encodeToken(key string) string { return base64.RawURLEncoding.EncodeToString([]byte(key)) }

func decodeToken(tok string) (string, error) {
	if tok == "" || len(tok) > maxToken {
		return "", fmt.Errorf("a token is 1 to %d bytes", maxToken)
	}
	key, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || len(key) == 0 {
		return "", fmt.Errorf("malformed token")
	}
	return string(key), nil
}

// tokenSuffix returns ";tk=<token>" for a decision asked with ?token=1 that has a key, else "".
func tokenSuffix(r *http.Request, d affinity.Decision) string {
	if r.URL.RawQuery == "" || r.URL.Query().Get("token") != "1" {
		return ""
	}
	k, ok := d.(hashKeyed)
	if !ok || k.HashKey() == "" {
		return ""
	}
	return ";" + TokenParam + "=" + encodeToken(k.HashKey())
}

// serveFailover answers POST {service}/failover with the body a token.
func (h *Handler) serveFailover(w http.ResponseWriter, r *http.Request, service string) {
	tok, ok := h.postedText(w, r)
	if !ok {
		return
	}
	key, err := decodeToken(tok)
	if err != nil {
		h.fail(w, http.StatusBadRequest, "BadToken", err.Error(), 0)
		return
	}
	d, inst, ok := h.decide(w, r, affinity.Request{Service: service, Protocol: affinity.ProtocolSIP, HashKey: key})
	if !ok {
		return
	}
	defer d.End()
	h.log.Info("sipdecide: dialog failover", "service", service, "instance", inst.ID)
	h.writeURI(w, inst, tokenSuffix(r, d))
}
