package session

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
)

// IDLen is the length of the ids NewID returns.
const IDLen = 32

// NewID returns a new session id: 128 bits from crypto/rand as 32 lower-case hex characters.
// Ids are unguessable, so holding one is the only way to reach its session. Safe for concurrent
// use.
func NewID() (string, error) {
	var b [IDLen / 2]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("new session id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// IsGeneratedID reports whether id has the shape of a NewID id (32 lower-case hex characters).
func IsGeneratedID(id string) bool {
	if len(id) != IDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// MaxIDLen is the longest session id a client may choose (header-field affinity).
const MaxIDLen = 64

// ValidID reports whether id may name a session: 1–64 characters, the first a letter, digit
// or '_', then letters, digits, '_' or '-'. Generated ids (NewID) always qualify; this is the
// rule for ids a client chooses in a header field or through the SessionAPI.
func ValidID(id string) bool {
	if len(id) == 0 || len(id) > MaxIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_':
		case c == '-' && i > 0:
		default:
			return false
		}
	}
	return true
}
