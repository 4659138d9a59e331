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
