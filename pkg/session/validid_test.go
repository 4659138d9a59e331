package session_test

import (
	"strings"
	"testing"

	"github.com/tether-dev/tether/pkg/session"
)

func TestValidID(t *testing.T) {
	generated, err := session.NewID()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		id   string
		want bool
	}{
		{generated, true},
		{"a", true},
		{"_x-1", true},
		{"9abc", true},
		{strings.Repeat("a", 64), true},
		{"", false},
		{strings.Repeat("a", 65), false},
		{"-leading-dash", false},
		{"has space", false},
		{"semi;colon", false},
		{"ünïcode", false},
	}
	for _, tc := range tests {
		t.Run(tc.id, func(t *testing.T) {
			if got := session.ValidID(tc.id); got != tc.want {
				t.Errorf("ValidID(%q) = %v, want %v", tc.id, got, tc.want)
			}
		})
	}
}
