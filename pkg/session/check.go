package session

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"
)

// The rules below are the Store contract's, shared by every backend (pkg/session/memstore,
// pkg/session/redisstore): the same session is valid or invalid whichever store holds it.

// Defaults shared by the stores' options.
const (
	// DefaultRetention is how long ended records stay readable.
	DefaultRetention = 24 * time.Hour
	// DefaultReapInterval is how often a store's Run ends lapsed sessions.
	DefaultReapInterval = time.Second
)

// MaxNameLen bounds the length in bytes of a session id, service name and instance id.
const MaxNameLen = 1024

// CloneAttributes returns a copy of a (nil when a is empty).
func CloneAttributes(a map[string]string) map[string]string {
	if len(a) == 0 {
		return nil
	}
	return maps.Clone(a)
}

// CheckName validates an id, service or instance name (field names it in the error): not
// empty, at most MaxNameLen bytes, no NUL byte. Errors wrap ErrInvalid.
func CheckName(field, v string) error {
	switch {
	case v == "":
		return fmt.Errorf("%w: empty %s", ErrInvalid, field)
	case len(v) > MaxNameLen:
		return fmt.Errorf("%w: %s longer than %d bytes", ErrInvalid, field, MaxNameLen)
	case strings.IndexByte(v, 0) >= 0:
		return fmt.Errorf("%w: NUL byte in %s", ErrInvalid, field)
	}
	return nil
}

// CheckSession validates the fields every stored session must satisfy (names, TTL, idle
// timeout, created time). Errors wrap ErrInvalid.
func CheckSession(s Session) error {
	for _, f := range []struct{ name, v string }{
		{"id", s.ID}, {"service", s.Service}, {"instance", s.Instance},
	} {
		if err := CheckName(f.name, f.v); err != nil {
			return err
		}
	}
	switch {
	case s.TTL <= 0:
		return fmt.Errorf("%w: TTL %v is not positive", ErrInvalid, s.TTL)
	case s.IdleTimeout < 0:
		return fmt.Errorf("%w: negative idle timeout %v", ErrInvalid, s.IdleTimeout)
	case s.Created.UnixNano() <= 0 || s.Created.Year() >= 2262:
		// The hot word stores Unix nanoseconds and uses the sign bit as the "ended" flag.
		return fmt.Errorf("%w: created time %v out of range", ErrInvalid, s.Created)
	}
	return nil
}

// Bounds on a session's attributes, checked on Create and Update (not on snapshot restore,
// which keeps what an earlier release stored): a client that may write sessions cannot make
// one session cost more than about MaxAttributeBytes of memory, and every replica's copy of it.
const (
	// MaxAttributes is the most attributes one session may hold.
	MaxAttributes = 64
	// MaxAttributeBytes bounds the sum of the lengths of a session's attribute keys and values.
	MaxAttributeBytes = 16 << 10
)

// checkAttributes enforces MaxAttributes and MaxAttributeBytes; keys must not be empty.
func checkAttributes(attrs map[string]string) error {
	if len(attrs) > MaxAttributes {
		return fmt.Errorf("%w: %d attributes, at most %d", ErrInvalid, len(attrs), MaxAttributes)
	}
	n := 0
	for k, v := range attrs {
		if k == "" {
			return fmt.Errorf("%w: an attribute key is empty", ErrInvalid)
		}
		n += len(k) + len(v)
	}
	if n > MaxAttributeBytes {
		return fmt.Errorf("%w: attributes take %d bytes, at most %d", ErrInvalid, n, MaxAttributeBytes)
	}
	return nil
}

// PrepareCreate fills in and checks a session for Create at now (every Store's rules, see
// Store.Create); the result has its own Attributes map.
func PrepareCreate(s Session, now time.Time) (Session, error) {
	s.Status = StatusActive
	s.Ended = time.Time{}
	s.LastModified = now
	if s.Created.IsZero() {
		s.Created = now
	}
	s.Created = s.Created.UTC()
	if s.LastSeen.Before(s.Created) {
		s.LastSeen = s.Created
	}
	s.LastSeen = s.LastSeen.UTC()
	s.Attributes = CloneAttributes(s.Attributes)
	if err := errors.Join(CheckSession(s), checkAttributes(s.Attributes)); err != nil {
		return Session{}, fmt.Errorf("create session %q: %w", s.ID, err)
	}
	if !s.ActiveAt(now) {
		return Session{}, fmt.Errorf("create session %q: %w: lapsed at creation (expires %v)", s.ID, ErrInvalid, s.ExpiresAt())
	}
	return s, nil
}

// PrepareUpdate checks what an Update's fn made of old and returns the session to store at now
// (every Store's rules).
func PrepareUpdate(id string, old, v Session, now time.Time) (Session, error) {
	v.LastSeen = v.LastSeen.UTC()
	switch {
	case v.ID != old.ID, v.Service != old.Service:
		return Session{}, fmt.Errorf("update session %q: %w: id and service are immutable", id, ErrInvalid)
	case v.Status != StatusActive, !v.Ended.IsZero():
		return Session{}, fmt.Errorf("update session %q: %w: use End to end a session", id, ErrInvalid)
	case !v.Created.Equal(old.Created):
		return Session{}, fmt.Errorf("update session %q: %w: created is immutable", id, ErrInvalid)
	}
	if err := errors.Join(CheckSession(v), checkAttributes(v.Attributes)); err != nil {
		return Session{}, fmt.Errorf("update session %q: %w", id, err)
	}
	v.Created = old.Created
	v.LastModified = now
	v.Attributes = CloneAttributes(v.Attributes) // fn may keep a reference to the map it saw
	return v, nil
}
