package affinity

import (
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/tether-dev/tether/pkg/registry"
)

// requestCookie finds the first cookie called name in the request's Cookie headers. It
// allocates nothing.
func requestCookie(req *Request, name string) (string, bool) {
	for i := 0; ; i++ {
		line, ok := headerValue(req.Headers, req.HeaderSource, "cookie", i)
		if !ok {
			return "", false
		}
		if v, ok := cookieValue([]string{line}, name); ok {
			return v, true
		}
	}
}

// responseSetsCookie reports whether any of the response's Set-Cookie values sets a cookie
// called name.
func responseSetsCookie(resp *Response, name string) bool {
	for i := 0; ; i++ {
		v, ok := headerValue(resp.Headers, resp.HeaderSource, "set-cookie", i)
		if !ok {
			return false
		}
		if setsCookie([]string{v}, name) {
			return true
		}
	}
}

// cookieValue finds the first cookie called name in the Cookie header values. It allocates
// nothing.
func cookieValue(values []string, name string) (string, bool) {
	for _, line := range values {
		for line != "" {
			var part string
			part, line, _ = strings.Cut(line, ";")
			part = strings.TrimSpace(part)
			eq := strings.IndexByte(part, '=')
			if eq < 0 {
				continue
			}
			if strings.TrimSpace(part[:eq]) == name {
				v := strings.TrimSpace(part[eq+1:])
				if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
					v = v[1 : len(v)-1]
				}
				return v, true
			}
		}
	}
	return "", false
}

// setsCookie reports whether any Set-Cookie value sets a cookie called name.
func setsCookie(values []string, name string) bool {
	for _, v := range values {
		eq := strings.IndexByte(v, '=')
		if eq >= 0 && strings.TrimSpace(v[:eq]) == name {
			return true
		}
	}
	return false
}

// setCookie formats the Set-Cookie value of a session cookie.
func setCookie(c registry.Cookie, id string, maxAge time.Duration) string {
	var b strings.Builder
	b.Grow(len(c.Name) + len(id) + len(c.Path) + 64)
	b.WriteString(c.Name)
	b.WriteByte('=')
	b.WriteString(id)
	if !c.SessionLifetime {
		b.WriteString("; Max-Age=")
		b.WriteString(strconv.FormatInt(int64(max(maxAge/time.Second, 1)), 10))
	}
	b.WriteString("; Path=")
	b.WriteString(c.Path)
	if c.HTTPOnly {
		b.WriteString("; HttpOnly")
	}
	if c.Secure || c.SameSite == "None" {
		b.WriteString("; Secure") // browsers drop SameSite=None cookies without Secure
	}
	if c.SameSite != "" {
		b.WriteString("; SameSite=")
		b.WriteString(c.SameSite)
	}
	return b.String()
}

// maxMCPIDLen bounds the MCP session ids the engine stores.
const maxMCPIDLen = 256

// validMCPID reports whether s is a usable MCP session id: visible ASCII (0x21–0x7E), at most
// maxMCPIDLen bytes.
func validMCPID(s string) bool {
	if len(s) == 0 || len(s) > maxMCPIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// splitPath splits a request path into path and raw query.
func splitPath(p string) (path, query string) {
	path, query, _ = strings.Cut(p, "?")
	return path, query
}

// queryParam returns the first value of the query parameter name, unescaped.
func queryParam(query, name string) (string, bool) {
	for query != "" {
		var kv string
		kv, query, _ = strings.Cut(query, "&")
		k, v, _ := strings.Cut(kv, "=")
		if k != name {
			continue
		}
		if strings.ContainsAny(v, "%+") {
			u, err := url.QueryUnescape(v)
			if err != nil {
				return "", false
			}
			v = u
		}
		return v, true
	}
	return "", false
}
