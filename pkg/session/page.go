package session

import (
	"bytes"
	"encoding/base64"
)

// pageTokenVersion prefixes every page token, so the encoding can change later.
const pageTokenVersion = 1

// PageCursor is a position in (service, id) order: List returns sessions strictly after it.
// The zero value (Set false) is the beginning.
type PageCursor struct {
	Service, ID string
	Set         bool
}

// Covers reports whether (service, id) is at or before the cursor.
func (c PageCursor) Covers(service, id string) bool {
	return c.Set && (service < c.Service || service == c.Service && id <= c.ID)
}

// EncodePageToken returns the opaque List page token for "after (service, id)" that every
// Store in this module hands out: base64url of a version byte and service\x00id\x00 (the id
// itself, not a store's index form). It names a position, not an offset, so it stays valid
// whatever is inserted or deleted before the next page is fetched.
func EncodePageToken(service, id string) string {
	b := append([]byte{pageTokenVersion}, service...)
	b = append(append(append(b, 0), id...), 0)
	return base64.RawURLEncoding.EncodeToString(b)
}

// DecodePageToken returns the position EncodePageToken encoded in tok ("" is the beginning),
// or ErrInvalidPageToken.
func DecodePageToken(tok string) (PageCursor, error) {
	if tok == "" {
		return PageCursor{}, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || len(b) < 5 || b[0] != pageTokenVersion || b[len(b)-1] != 0 {
		return PageCursor{}, ErrInvalidPageToken
	}
	parts := bytes.Split(b[1:len(b)-1], []byte{0})
	if len(parts) != 2 || len(parts[0]) == 0 || len(parts[1]) == 0 {
		return PageCursor{}, ErrInvalidPageToken
	}
	return PageCursor{Service: string(parts[0]), ID: string(parts[1]), Set: true}, nil
}
