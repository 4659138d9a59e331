package extproc

import (
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// overwriteHeader is a set_headers entry that replaces every value of name: append_action
// OVERWRITE_IF_EXISTS_OR_ADD, the value in raw_value, the legacy append field left unset.
//
// Every reader agrees on it: Envoy's ext_proc (mutation_utils.cc) takes a non-default
// append_action as given, and an Envoy that knows only the legacy field reads an unset append
// as false (overwrite); gRPC's ext_proc (gRFC A93) honours append_action alone.
func overwriteHeader(name, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: name, RawValue: []byte(value)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// appendHeader is a set_headers entry that adds a value beside existing ones (Set-Cookie):
// append_action APPEND_IF_EXISTS_OR_ADD together with the legacy append true.
//
// Both are needed: APPEND_IF_EXISTS_OR_ADD is enum value 0, indistinguishable from unset, so
// Envoy's ext_proc then decides by the legacy append field (default false, overwrite); gRPC's
// ext_proc (A93) ignores append and reads the 0 as append. The pair (append true with the
// default action) is also the only combination Envoy's header parser accepts when both are set.
func appendHeader(name, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: name, RawValue: []byte(value)},
		AppendAction: corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD,
		Append:       wrapperspb.Bool(true), //nolint:staticcheck // deprecated, but Envoy reads it for action 0
	}
}

// headerOption is appendHeader or overwriteHeader.
func headerOption(name, value string, appendValue bool) *corev3.HeaderValueOption {
	if appendValue {
		return appendHeader(name, value)
	}
	return overwriteHeader(name, value)
}
