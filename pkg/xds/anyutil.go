package xds

import (
	"fmt"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// deterministic returns the marshalling used for every Any and every content hash, so that
// equal protos always produce equal bytes (map fields sorted).
func deterministic() proto.MarshalOptions { return proto.MarshalOptions{Deterministic: true} }

// toAny packs m deterministically. It fails only for messages that cannot be marshalled,
// which the builders never produce; the error is still returned rather than panicking.
func toAny(m proto.Message) (*anypb.Any, error) {
	a := &anypb.Any{}
	if err := anypb.MarshalFrom(a, m, deterministic()); err != nil {
		return nil, fmt.Errorf("pack %T: %w", m, err)
	}
	return a, nil
}

// typedExtension wraps m as a named TypedExtensionConfig.
func typedExtension(name string, m proto.Message) (*corev3.TypedExtensionConfig, error) {
	a, err := toAny(m)
	if err != nil {
		return nil, err
	}
	return &corev3.TypedExtensionConfig{Name: name, TypedConfig: a}, nil
}
