package envoyharness

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// Envoy's HTTP connection manager defaults (max_request_headers_count, max_request_headers_kb).
const (
	maxHeadersCount = 100
	maxHeadersBytes = 60 << 10
)

// hopByHop are the headers Envoy's HTTP/1 codec consumes instead of passing them through the
// filter chain.
var hopByHop = map[string]bool{
	"connection": true, "keep-alive": true, "proxy-connection": true, "transfer-encoding": true,
	"upgrade": true, "te": true, "trailer": true,
}

// headerMap is an ordered multi-map with lower-case keys, like Envoy's HeaderMapImpl.
type headerMap struct {
	entries []headerEntry
}

type headerEntry struct{ key, value string }

func (h *headerMap) get(key string) []string {
	var out []string
	for _, e := range h.entries {
		if e.key == key {
			out = append(out, e.value)
		}
	}
	return out
}

func (h *headerMap) first(key string) string {
	for _, e := range h.entries {
		if e.key == key {
			return e.value
		}
	}
	return ""
}

func (h *headerMap) add(key, value string) { h.entries = append(h.entries, headerEntry{key, value}) }

// set replaces every value of key with value (Envoy's setCopy).
func (h *headerMap) set(key, value string) {
	for i := range h.entries {
		if h.entries[i].key == key {
			h.entries[i].value = value
			h.removeAfter(key, i+1)
			return
		}
	}
	h.add(key, value)
}

func (h *headerMap) removeAfter(key string, from int) {
	out := h.entries[:from]
	for _, e := range h.entries[from:] {
		if e.key != key {
			out = append(out, e)
		}
	}
	h.entries = out
}

func (h *headerMap) remove(key string) { h.removeAfter(key, 0) }

func (h *headerMap) byteSize() int {
	n := 0
	for _, e := range h.entries {
		n += len(e.key) + len(e.value)
	}
	return n
}

// proto renders the map as Envoy sends it to the processor: raw_value only (Envoy's default
// runtime envoy.reloadable_features.send_header_raw_value).
func (h *headerMap) proto() *corev3.HeaderMap {
	out := &corev3.HeaderMap{Headers: make([]*corev3.HeaderValue, 0, len(h.entries))}
	for _, e := range h.entries {
		out.Headers = append(out.Headers, &corev3.HeaderValue{Key: e.key, RawValue: []byte(e.value)})
	}
	return out
}

// fromHTTP appends Go header fields, lower-cased, sorted by name for deterministic order,
// without hop-by-hop headers.
func (h *headerMap) fromHTTP(hdr map[string][]string) {
	keys := make([]string, 0, len(hdr))
	for k := range hdr {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		lk := strings.ToLower(k)
		if lk == "host" {
			continue
		}
		for _, v := range hdr[k] {
			// The connection manager strips TE except "te: trailers", which gRPC needs.
			if hopByHop[lk] && (lk != "te" || !strings.EqualFold(strings.TrimSpace(v), "trailers")) {
				continue
			}
			h.add(lk, v)
		}
	}
}

// mutationRules is Envoy's default HeaderMutationRules checker (no mutation_rules configured):
// routing headers (host, :authority, :method, :scheme) and x-envoy-* may not be set or
// appended; pseudo headers and host may never be removed. Disallowed mutations are ignored
// and counted, never errors (disallow_is_error false).
type mutationRules struct{}

func (mutationRules) allowed(name string) bool {
	switch name {
	case "host", ":authority", ":method", ":scheme":
		return false
	}
	return !strings.HasPrefix(name, "x-envoy-")
}

func (r mutationRules) allowedRemove(name string) bool {
	if strings.HasPrefix(name, ":") || name == "host" {
		return false
	}
	return r.allowed(name)
}

// errMutation is a mutation Envoy refuses with an error (the request then gets a local reply
// with status_on_error).
var errMutation = errors.New("invalid header mutation")

// Semantics is whose reading of a header mutation's append fields the harness applies.
type Semantics int

const (
	// EnvoySemantics is Envoy's ext_proc filter (MutationUtils::applyHeaderMutations): a
	// non-default append_action is taken as given; APPEND_IF_EXISTS_OR_ADD (enum 0, the
	// default) defers to the deprecated append BoolValue, which defaults to false (overwrite).
	EnvoySemantics Semantics = iota
	// GRPCSemantics is gRPC's xDS ext_proc filter (gRFC A93, proxyless gRPC): only
	// append_action counts; the deprecated append field is ignored, so the default action
	// appends.
	GRPCSemantics
)

// applyMutation applies m to h following Envoy's MutationUtils::applyHeaderMutations (or
// gRFC A93's reading of append_action with GRPCSemantics). It returns how many mutations were
// ignored by the rules.
func applyMutation(m *extprocv3.HeaderMutation, h *headerMap, sem Semantics) (ignored int, err error) {
	if m == nil {
		return 0, nil
	}
	if len(m.GetRemoveHeaders()) > maxHeadersCount || len(m.GetSetHeaders()) > maxHeadersCount {
		return 0, fmt.Errorf("%w: more than %d headers", errMutation, maxHeadersCount)
	}
	rules := mutationRules{}
	for _, name := range m.GetRemoveHeaders() {
		if !validHeaderName(name) {
			return ignored, fmt.Errorf("%w: invalid character in remove_headers", errMutation)
		}
		name = strings.ToLower(name)
		if !rules.allowedRemove(name) {
			ignored++
			continue
		}
		h.remove(name)
	}
	for _, sh := range m.GetSetHeaders() {
		hv := sh.GetHeader()
		if hv == nil {
			continue
		}
		if hv.GetValue() != "" && len(hv.GetRawValue()) > 0 {
			return ignored, fmt.Errorf("%w: only one of value or raw_value may be set", errMutation)
		}
		// With send_header_raw_value (default on) Envoy reads raw_value only: a processor
		// that fills value alone sets an empty header.
		value := string(hv.GetRawValue())
		if !validHeaderName(hv.GetKey()) || !validHeaderValue(value) {
			return ignored, fmt.Errorf("%w: invalid character in set_headers", errMutation)
		}
		name := strings.ToLower(hv.GetKey())
		var appendMode, apply bool
		switch sh.GetAppendAction() {
		case corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD:
			// Enum value 0: indistinguishable from "unset". Envoy then lets the legacy append
			// BoolValue decide, defaulting to false (overwrite); A93 appends.
			appendMode, apply = sh.GetAppend().GetValue(), true //nolint:staticcheck // Envoy reads the legacy field here too
			if sem == GRPCSemantics {
				appendMode = true
			}
		case corev3.HeaderValueOption_ADD_IF_ABSENT:
			appendMode, apply = true, len(h.get(name)) == 0
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD:
			appendMode, apply = false, true
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS:
			appendMode, apply = false, len(h.get(name)) > 0
		default:
			return ignored, fmt.Errorf("%w: invalid append_action", errMutation)
		}
		if !apply {
			continue
		}
		if !rules.allowed(name) {
			ignored++
			continue
		}
		if appendMode {
			h.add(name, value)
		} else {
			h.set(name, value)
		}
	}
	if len(h.entries) > maxHeadersCount || h.byteSize() > maxHeadersBytes {
		return ignored, fmt.Errorf("%w: result exceeds the header limits", errMutation)
	}
	return ignored, nil
}

// validHeaderName follows Envoy's HeaderUtility::headerNameIsValid: an RFC 7230 token,
// optionally prefixed by ':' for pseudo headers.
func validHeaderName(name string) bool {
	name = strings.TrimPrefix(name, ":")
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// validHeaderValue rejects NUL, CR and LF, as Envoy's HeaderUtility::headerValueIsValid.
func validHeaderValue(v string) bool {
	return !strings.ContainsAny(v, "\x00\r\n")
}
