package extproc

import (
	"strings"
	"unsafe"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
)

// envoyHeaders is Envoy's header list as an affinity.HeaderSource: the engine's few lookups
// (the session cookie, a header or two of the service's mode) scan the list instead of a map
// built per headers message. Pseudo headers (":path", …) are not part of it.
//
// Values alias the message's raw_value bytes (no copy): a ProcessingRequest is decoded into a
// fresh message per Recv and nothing modifies it afterwards, so the strings stay valid and
// immutable for as long as anything holds them.
type envoyHeaders corev3.HeaderMap

// HeaderValue implements affinity.HeaderSource. Names compare case-insensitively (Envoy sends
// lower-case names; other clients may not).
func (h *envoyHeaders) HeaderValue(name string, i int) (string, bool) {
	if h == nil || strings.HasPrefix(name, ":") {
		return "", false
	}
	for _, hv := range h.Headers {
		if k := hv.GetKey(); len(k) == len(name) && (k == name || strings.EqualFold(k, name)) {
			if i == 0 {
				return headerValueOf(hv), true
			}
			i--
		}
	}
	return "", false
}

// HeaderMap implements affinity.HeaderSource (for DCR rules, which may read any header).
func (h *envoyHeaders) HeaderMap() map[string][]string {
	if h == nil {
		return map[string][]string{}
	}
	return headerMapOf(h.Headers, func(string, string) {})
}

// headerValueOf is the header's value, raw_value (what Envoy sends by default,
// envoy.reloadable_features.send_header_raw_value) or value, without copying raw_value (see
// envoyHeaders).
func headerValueOf(hv *corev3.HeaderValue) string {
	if raw := hv.GetRawValue(); len(raw) > 0 {
		return unsafe.String(&raw[0], len(raw))
	}
	return hv.GetValue()
}
