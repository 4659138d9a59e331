package config_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-dev/tether/pkg/config"
	"github.com/tether-dev/tether/pkg/registry"
)

// head is a valid file start: apiVersion plus one service with one instance, 7 lines long, so
// a case's own lines start at line 8 (services[1] when it adds "- name: ...").
const head = `apiVersion: tether/v1
services:
- name: web
  instances:
  - id: a
    address: 10.0.0.1
    ports: {http: 8081}
`

// fixtures creates the files the cases name, in the current (temporary) directory.
func fixtures(t *testing.T) {
	t.Helper()
	t.Chdir(t.TempDir())
	for name, content := range map[string]string{
		"rules.xml":  "<rules/>\n",
		"token.txt":  "  s3cret-from-file\n",
		"empty.txt":  "\n \n",
		"sub/x.yaml": "",
	} {
		if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(name, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func errorLines(t *testing.T, err error) []string {
	t.Helper()
	if err == nil {
		return nil
	}
	var errs config.Errors
	if !errors.As(err, &errs) {
		t.Fatalf("error %v (%T) is not a config.Errors", err, err)
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != len(errs) {
		t.Errorf("Error() has %d lines for %d errors", len(lines), len(errs))
	}
	return lines
}

func TestParseErrors(t *testing.T) {
	fixtures(t)
	tests := []struct {
		name string
		yaml string
		want []string
	}{
		{
			name: "the issue's example on line 14",
			yaml: `apiVersion: tether/v1
# A comment block to push the service down.
#
#
#
listeners:
  api: 127.0.0.1:9000
log:
  level: info
services:
- name: web
  match:
    pathPrefix: /
  sessionsPerInstance: 500
  instances: [{id: a, address: 10.0.0.1, ports: {http: 8081}}]
`,
			want: []string{"tether.yaml:14: services[0].sessionsPerInstance: 500 is out of range 1..200"},
		},
		{
			name: "gc heap floor out of range",
			yaml: head + "runtime: {gcHeapFloorMiB: -1}\n",
			want: []string{"tether.yaml:8: runtime.gcHeapFloorMiB: -1 is out of range 0..65536"},
		},
		{
			name: "redis backend mistakes",
			yaml: head + "store:\n  backend: redis\n  snapshotPath: s.snap\n  redis: {keyPrefix: 'a{b', db: 16, touchDelay: 1ms, passwordFile: nope.txt}\n",
			want: []string{
				"tether.yaml:10: store.snapshotPath: snapshots are for the memory backend; with redis, persistence is Redis's (appendonly)",
				"tether.yaml:11: store.redis.addresses: required with store.backend: redis (host:port of the server, Cluster seeds or Sentinels)",
				"tether.yaml:11: store.redis.db: 16 is out of range 0..15",
				"tether.yaml:11: store.redis.keyPrefix: must not contain '{' or '}' (they delimit Cluster hash tags)",
				"tether.yaml:11: store.redis.touchDelay: 1ms is out of range 10ms..10s",
				"tether.yaml:11: store.redis.passwordFile: cannot read: open nope.txt: no such file or directory",
			},
		},
		{
			name: "ackDurability mistakes",
			yaml: head + "store:\n  backend: redis\n  redis: {addresses: ['127.0.0.1:6379'], ackDurability: fsync, ackReplicas: 0, ackTimeout: 0s}\n",
			want: []string{
				`tether.yaml:10: store.redis.ackDurability: "fsync" is not one of none, aof, replica`,
				"tether.yaml:10: store.redis.ackReplicas: 0 is out of range 1..64",
				"tether.yaml:10: store.redis.ackTimeout: 0s is shorter than 1ms (WAIT 0 would wait forever)",
			},
		},
		{
			name: "ackTimeout beyond the call timeout",
			yaml: head + "extProc: {messageTimeout: 200ms}\nstore:\n  backend: redis\n  redis: {addresses: ['127.0.0.1:6379'], ackDurability: replica, ackTimeout: 50ms}\n",
			want: []string{
				"tether.yaml:11: store.redis.ackTimeout: 50ms is not shorter than the store's call timeout on a request's path (extProc.messageTimeout / 4 = 50ms), inside which a new session waits for its acknowledgement: lower it, or raise extProc.messageTimeout",
			},
		},
		{
			name: "api storeTimeout out of range",
			yaml: head + "api: {storeTimeout: 1ms}\n",
			want: []string{"tether.yaml:8: api.storeTimeout: 1ms is out of range 10ms..30s"},
		},
		{
			name: "unknown store backend",
			yaml: head + "store: {backend: etcd}\n",
			want: []string{`tether.yaml:8: store.backend: "etcd" is not one of memory, redis`},
		},
		{
			name: "handle affinity mistakes",
			yaml: `apiVersion: tether/v1
services:
- name: web
  affinity: cookie
  mcpHandle: {header: Handle}
  instances: [{id: a, address: 10.0.0.1, ports: {http: 8081}}]
- name: mcp
  affinity: mcp-streamable
  match: {pathPrefix: /mcp}
  mcpHandle: {header: "bad header", learnHeader: "", instancePrefix: false}
  instances: [{id: a, address: 10.0.0.1, ports: {http: 8082}}]
- name: mcp2
  affinity: mcp-streamable
  match: {pathPrefix: /mcp2}
  mcpHandle: {header: Handle, instancePrefix: true, prefixSeparator: "-"}
  instances: [{id: a, address: 10.0.0.1, ports: {http: 8083}}]
`,
			want: []string{
				"tether.yaml:5: services[0].mcpHandle.header: handle affinity is for mcp-streamable services (affinity cookie)",
				`tether.yaml:10: services[1].mcpHandle.header: "bad header" is not an x-mcp-header name (letters, digits and -, at most 64)`,
				"tether.yaml:10: services[1].mcpHandle.learnHeader: a handle is bound from learnHeader or from its instance prefix: set learnHeader or instancePrefix: true",
				`tether.yaml:15: services[2].mcpHandle.prefixSeparator: "-" must be one visible character that instance ids cannot contain (not a letter, digit, '-', '.' or '_')`,
			},
		},
		{
			name: "call load where it cannot work",
			yaml: `apiVersion: tether/v1
services:
- name: web
  affinity: cookie
  calls: {track: true}
  instances: [{id: a, address: 10.0.0.1, ports: {http: 8081}}]
- name: voice
  affinity: hash
  match: {pathPrefix: /voice}
  calls: {capPerInstance: -1, ttl: 0s}
  instances: [{id: a, address: 10.0.0.1, ports: {sip: 5070}}]
- name: voice2
  affinity: hash
  match: {pathPrefix: /voice2}
  calls: {capPerInstance: 5}
  instances: [{id: a, address: 10.0.0.1, ports: {sip: 5071}}]
`,
			want: []string{
				"tether.yaml:5: services[0].calls.track: affinity cookie does not serve SIP (only none and hash do): it has no calls to count",
				"tether.yaml:10: services[1].calls.capPerInstance: -1 is out of range 0..1000000",
				"tether.yaml:10: services[1].calls.ttl: 0s is out of range 1s..48h",
				"tether.yaml:15: services[2].calls.capPerInstance: needs calls.track: true (calls are counted only when tracked)",
			},
		},
		{
			name: "missing apiVersion",
			yaml: "services: []\n",
			want: []string{"tether.yaml: apiVersion: required; set apiVersion: tether/v1"},
		},
		{
			name: "empty file",
			yaml: "",
			want: []string{"tether.yaml: apiVersion: required; set apiVersion: tether/v1"},
		},
		{
			name: "wrong apiVersion",
			yaml: "apiVersion: tether/v2\n",
			want: []string{`tether.yaml:1: apiVersion: "tether/v2" is not supported (want tether/v1)`},
		},
		{
			name: "not a mapping",
			yaml: "- apiVersion: tether/v1\n",
			want: []string{"tether.yaml:1: a config file must be a YAML mapping, got a list"},
		},
		{
			name: "yaml syntax error",
			yaml: "apiVersion: tether/v1\nlog:\n  level: info\n format: text\n",
			// The line is libyaml's: where the enclosing block started.
			want: []string{"tether.yaml:3: did not find expected key"},
		},
		{
			name: "yaml syntax error on the first line",
			yaml: "apiVersion: tether/v1: x\n",
			want: []string{"tether.yaml: mapping values are not allowed in this context"},
		},
		{
			name: "two documents",
			yaml: "apiVersion: tether/v1\n---\napiVersion: tether/v1\n",
			want: []string{"tether.yaml:2: a config file holds one YAML document; found another"},
		},
		{
			name: "unknown fields, with and without a suggestion",
			yaml: head + "listener: {}\nfrobnicate: 1\n" + "  # services[0] continues below\n",
			want: []string{
				"tether.yaml:8: listener: unknown field (did you mean listeners?)",
				"tether.yaml:9: frobnicate: unknown field",
			},
		},
		{
			name: "unknown nested field",
			yaml: head + "- name: api\n  sesionTTL: 5m\n  instances: [{id: a, address: 10.0.0.1, ports: {http: 1}, port: 2}]\n  match: {authorities: [api.example]}\n",
			want: []string{
				"tether.yaml:9: services[1].sesionTTL: unknown field (did you mean sessionTTL?)",
				"tether.yaml:10: services[1].instances[0].port: unknown field (did you mean ports?)",
			},
		},
		{
			name: "duplicate key",
			yaml: head + "- name: api\n  match: {pathPrefix: /api}\n  name: web\n",
			want: []string{"tether.yaml:10: services[1].name: duplicate key (first set on line 8)"},
		},
		{
			name: "type errors",
			yaml: head + `- name: api
  match: [/api]
  sessionsPerInstance: "20"
  requestSlotsPerInstance: 1.5
  disableSessionIdReuse: yes
  sessionTTL: 30
  idleTimeout: {m: 1}
  hashBalanceFactor: lots
  instances: {id: a}
`,
			want: []string{
				`tether.yaml:9: services[1].match: expected a mapping, got a list`,
				`tether.yaml:10: services[1].sessionsPerInstance: expected an integer, got the quoted string "20"`,
				`tether.yaml:11: services[1].requestSlotsPerInstance: expected an integer, got "1.5"`,
				`tether.yaml:12: services[1].disableSessionIdReuse: expected true or false, got "yes"`,
				`tether.yaml:13: services[1].sessionTTL: "30" is not a duration (write a number with a unit: 500ms, 30s, 6h)`,
				`tether.yaml:14: services[1].idleTimeout: expected a duration such as 30s, got a mapping`,
				`tether.yaml:15: services[1].hashBalanceFactor: expected a number, got "lots"`,
				`tether.yaml:16: services[1].instances: expected a list, got a mapping`,
			},
		},
		{
			name: "listeners",
			yaml: `apiVersion: tether/v1
listeners:
  extProc: localhost
  xds: 127.0.0.1:99999
  api: 127.0.0.1:9060
  sip: 127.0.0.1:9060
`,
			want: []string{
				`tether.yaml:3: listeners.extProc: "localhost" is not host:port`,
				`tether.yaml:4: listeners.xds: "127.0.0.1:99999": port must be a number 0..65535`,
				`tether.yaml:6: listeners.sip: 127.0.0.1:9060 is already used by listeners.api`,
			},
		},
		{
			name: "api hosts and origins",
			yaml: "apiVersion: tether/v1\napi:\n  hosts: [tether.internal, 'a b', 'x:9000']\n  origins: ['https://ops.example.com', 'ops.example.com', 'http://x/path', 'ftp://x']\n",
			want: []string{
				`tether.yaml:3: api.hosts[1]: "a b" is not a host name (no port, no scheme)`,
				`tether.yaml:3: api.hosts[2]: "x:9000" is not a host name (no port, no scheme)`,
				`tether.yaml:4: api.origins[1]: "ops.example.com" is not an origin: want scheme://host[:port] (http or https, no path)`,
				`tether.yaml:4: api.origins[2]: "http://x/path" is not an origin: want scheme://host[:port] (http or https, no path)`,
				`tether.yaml:4: api.origins[3]: "ftp://x" is not an origin: want scheme://host[:port] (http or https, no path)`,
			},
		},
		{
			name: "shutdown",
			yaml: "apiVersion: tether/v1\nstore: {backend: redis, redis: {addresses: [127.0.0.1:6379]}}\nshutdown: {drainTimeout: 25h, handoff: true}\n",
			want: []string{
				"tether.yaml:3: shutdown.drainTimeout: 25h is out of range 0s..24h",
			},
		},
		{
			name: "non-loopback api needs tokens",
			yaml: "apiVersion: tether/v1\nlisteners:\n  api: 0.0.0.0:9000\n",
			want: []string{"tether.yaml:3: listeners.api: 0.0.0.0:9000 is not a loopback address: configure auth.tokens, or set auth.allowInsecure: true to serve the API without authentication"},
		},
		{
			name: "log, store, extProc and envoy",
			yaml: `apiVersion: tether/v1
log: {format: yaml, level: trace}
store: {snapshotInterval: 0s, retention: 721h, onCorruptSnapshot: ignore}
extProc: {destinationHeader: X-Dest, metadataNamespace: "", servedHostKey: "", messageTimeout: 2m, maxRequestLifetime: 0s, bodyMode: half-duplex, defaultService: Pool_1, grpcClientTarget: "tether 9002"}
envoy: {listenerAddress: "10000", adminAddress: "[::1]:9901"}
`,
			want: []string{
				`tether.yaml:2: log.format: "yaml" is not one of text, json`,
				`tether.yaml:2: log.level: "trace" is not one of debug, info, warn, error`,
				`tether.yaml:3: store.snapshotInterval: 0s is out of range 1s..24h`,
				`tether.yaml:3: store.retention: 721h is out of range 0s..720h`,
				`tether.yaml:3: store.onCorruptSnapshot: "ignore" is not one of fail, moveAside`,
				`tether.yaml:4: extProc.destinationHeader: "X-Dest" is not a lower-case HTTP header name`,
				`tether.yaml:4: extProc.metadataNamespace: must not be empty`,
				`tether.yaml:4: extProc.servedHostKey: must not be empty`,
				`tether.yaml:4: extProc.messageTimeout: 2m is out of range 1ms..1m`,
				`tether.yaml:4: extProc.maxRequestLifetime: 0s is out of range 1s..24h`,
				`tether.yaml:4: extProc.grpcClientTarget: "tether 9002": want a gRPC target URI such as dns:///tether:9002`,
				`tether.yaml:4: extProc.bodyMode: "half-duplex" is not one of none, full-duplex`,
				`tether.yaml:4: extProc.defaultService: "Pool_1" is not a service name`,
				`tether.yaml:5: envoy.listenerAddress: "10000" is not host:port`,
			},
		},
		{
			name: "service names",
			yaml: head + "- name: Web_1\n  match: {pathPrefix: /a}\n- name: web\n  match: {pathPrefix: /b}\n- match: {pathPrefix: /c}\n",
			want: []string{
				`tether.yaml:8: services[1].name: "Web_1" must be at most 63 lower-case letters, digits and -, starting and ending with a letter or digit`,
				`tether.yaml:10: services[2].name: duplicate service name "web" (also services[0])`,
				`tether.yaml:12: services[3].name: required`,
			},
		},
		{
			name: "matches",
			yaml: head + "- name: api\n  match: {authorities: [api.example:443, API.example]}\n- name: api2\n  match: {authorities: [api.example]}\n- name: root\n",
			want: []string{
				`tether.yaml:9: services[1].match.authorities[0]: "api.example:443" is not a host name (no scheme, no port)`,
				`tether.yaml:11: services[2].match: same match as services[1] (api): requests could go to either`,
				`tether.yaml:12: services[3].match: same match as services[0] (web): requests could go to either`,
			},
		},
		{
			name: "affinity and balancing",
			yaml: head + `- name: a
  match: {pathPrefix: /a}
  affinity: sticky
  balancing: random
- name: b
  match: {pathPrefix: /b}
  affinity: hash
  balancing: least-request
`,
			want: []string{
				`tether.yaml:10: services[1].affinity: "sticky" is not one of none, cookie, header, mcp-streamable, mcp-sse, hash`,
				`tether.yaml:11: services[1].balancing: "random" is not one of round-robin, sticky-round-robin, least-request, consistent-hash`,
				`tether.yaml:15: services[2].balancing: affinity hash needs balancing consistent-hash, not least-request`,
			},
		},
		{
			name: "quotas and durations",
			yaml: head + `- name: a
  match: {pathPrefix: /a}
  sessionsPerInstance: 0
  requestSlotsPerInstance: 10001
  sessionTTL: 500ms
  idleTimeout: -1s
  maxLifetime: 25h
- name: b
  match: {pathPrefix: /b}
  sessionTTL: 10m
  idleTimeout: 11m
`,
			want: []string{
				`tether.yaml:10: services[1].sessionsPerInstance: 0 is out of range 1..200`,
				`tether.yaml:11: services[1].requestSlotsPerInstance: 10001 is out of range 1..10000`,
				`tether.yaml:12: services[1].sessionTTL: 500ms is out of range 1s..6h`,
				`tether.yaml:13: services[1].idleTimeout: -1s is out of range 0s..6h`,
				`tether.yaml:14: services[1].maxLifetime: 25h is out of range 0s..24h`,
				`tether.yaml:18: services[2].idleTimeout: 11m is longer than sessionTTL 10m`,
			},
		},
		{
			name: "cookie, sticky, header field, sse",
			yaml: head + `- name: a
  match: {pathPrefix: /mcp}
  affinity: mcp-sse
  cookie: {name: "my cookie", path: x, sameSite: lax}
  sticky: {upstreamCookie: "a;b"}
  headerField: x-ab
  sse: {path: /sse, sessionParam: sid}
- name: b
  match: {pathPrefix: /b}
  cookie: {sameSite: None}
  headerField: 1abcde
  sse: {path: sse}
`,
			want: []string{
				`tether.yaml:11: services[1].cookie.name: "my cookie" is not a valid cookie name`,
				`tether.yaml:11: services[1].cookie.path: "x" must start with /`,
				`tether.yaml:11: services[1].cookie.sameSite: "lax" is not one of Lax, Strict, None, `,
				`tether.yaml:12: services[1].sticky.upstreamCookie: "a;b" is not a valid cookie name`,
				`tether.yaml:13: services[1].headerField: "x-ab" must be 5..40 characters: a letter, then letters, digits, - or _`,
				`tether.yaml:14: services[1].sse.path: /sse is outside match.pathPrefix /mcp, so SSE requests would not reach this service`,
				`tether.yaml:14: services[1].sse.sessionParam: "sid" is not one of sessionId, session_id, sessionid`,
				`tether.yaml:17: services[2].cookie.sameSite: None needs cookie.secure: true (browsers drop SameSite=None cookies without Secure)`,
				`tether.yaml:18: services[2].headerField: "1abcde" must be 5..40 characters: a letter, then letters, digits, - or _`,
				`tether.yaml:19: services[2].sse.path: "sse" must start with /`,
			},
		},
		{
			name: "files, hash factor, upstream",
			yaml: head + `- name: a
  match: {pathPrefix: /a}
  dcrFile: missing.xml
  hashBalanceFactor: 0.9
  upstream: {protocol: http3, connectTimeout: 0s}
  bodyMode: streamed
- name: b
  match: {pathPrefix: /b}
  dcrFile: sub
`,
			want: []string{
				`tether.yaml:10: services[1].dcrFile: cannot read rules: stat missing.xml: no such file or directory`,
				`tether.yaml:11: services[1].hashBalanceFactor: 0.9 must be 0 (off) or at least 1`,
				`tether.yaml:12: services[1].upstream.protocol: "http3" is not one of http1, http2`,
				`tether.yaml:12: services[1].upstream.connectTimeout: 0s is out of range 1ms..1m`,
				`tether.yaml:13: services[1].bodyMode: "streamed" is not one of none, full-duplex`,
				`tether.yaml:16: services[2].dcrFile: sub is a directory`,
			},
		},
		{
			name: "health checks",
			yaml: head + `- name: a
  match: {pathPrefix: /a}
  healthCheck: {path: healthz, interval: 5ms, healthyThreshold: 0, unhealthyThreshold: 101}
- name: b
  match: {pathPrefix: /b}
  healthCheck:
    interval: 100ms
    timeout: 200ms
`,
			want: []string{
				`tether.yaml:10: services[1].healthCheck.path: "healthz" must start with /`,
				`tether.yaml:10: services[1].healthCheck.interval: 5ms is out of range 10ms..1h`,
				`tether.yaml:10: services[1].healthCheck.healthyThreshold: 0 is out of range 1..100`,
				`tether.yaml:10: services[1].healthCheck.unhealthyThreshold: 101 is out of range 1..100`,
				`tether.yaml:15: services[2].healthCheck.timeout: 200ms is longer than healthCheck.interval 100ms`,
			},
		},
		{
			name: "instances",
			yaml: `apiVersion: tether/v1
services:
- name: web
  affinity: cookie
  instances:
  - id: a
    address: web-1.internal
    ports: {http: 8081}
  - id: a
    address: 0.0.0.0
    ports: {http: 70000}
    weight: 1001
    state: paused
  - id: "b c"
    address: 10.0.0.1
  - address: fe80::1%eth0
    ports: {sip: 5060}
  - id: d
    address: 10.0.0.1
    ports: {http: 8081}
  - id: e
    address: 10.0.0.1
    ports: {http: 8081}
`,
			want: []string{
				`tether.yaml:7: services[0].instances[0].address: "web-1.internal" is not an IP address (host names are not resolved)`,
				`tether.yaml:9: services[0].instances[1].id: duplicate instance id "a" (also instances[0])`,
				`tether.yaml:10: services[0].instances[1].address: 0.0.0.0 is the unspecified address, not an instance's address`,
				`tether.yaml:11: services[0].instances[1].ports.http: 70000 is out of range 0..65535`,
				`tether.yaml:12: services[0].instances[1].weight: 1001 is out of range 1..1000`,
				`tether.yaml:13: services[0].instances[1].state: "paused" is not one of active, standby, draining`,
				`tether.yaml:14: services[0].instances[2].id: "b c" must be at most 63 letters, digits, -, . and _, starting and ending with a letter or digit`,
				`tether.yaml:14: services[0].instances[2].ports: set ports.http, ports.sip or both`,
				`tether.yaml:16: services[0].instances[3].id: required`,
				`tether.yaml:16: services[0].instances[3].address: "fe80::1%eth0": IPv6 zones are not supported`,
				`tether.yaml:17: services[0].instances[3].ports.http: required: affinity cookie routes HTTP requests`,
				`tether.yaml:23: services[0].instances[5].ports.http: 10.0.0.1:8081 is already used by instances[4] (d)`,
			},
		},
		{
			name: "plain-text listeners off loopback",
			yaml: head + "listeners: {extProc: ':9002', xds: 0.0.0.0:18000, sip: '[::]:9060', api: 10.0.0.1:9000}\nauth: {allowInsecure: true}\n",
			want: []string{
				`tether.yaml:8: listeners.extProc: :9002 is not a loopback address: configure tls (certFile, keyFile), or set listeners.allowInsecure: true to serve it in plain text`,
				`tether.yaml:8: listeners.xds: 0.0.0.0:18000 is not a loopback address: configure tls (certFile, keyFile), or set listeners.allowInsecure: true to serve it in plain text`,
				`tether.yaml:8: listeners.api: 10.0.0.1:9000 is not a loopback address: configure tls (certFile, keyFile), or set listeners.allowInsecure: true to serve it in plain text`,
				`tether.yaml:8: listeners.sip: [::]:9060 is not a loopback address: configure tls (certFile, keyFile), or set listeners.allowInsecure: true to serve it in plain text`,
			},
		},
		{
			name: "tls files",
			yaml: head + "tls: {certFile: tls.crt}\nenvoy: {tls: {keyFile: envoy.key}}\n",
			want: []string{
				`tether.yaml:8: tls: set both certFile and keyFile, or neither`,
				`tether.yaml:8: tls.certFile: cannot read: stat tls.crt: no such file or directory`,
				`tether.yaml:9: envoy.tls: set both certFile and keyFile, or neither`,
			},
		},
		{
			name: "client CA without a certificate",
			yaml: head + "tls: {clientCAFile: rules.xml}\n",
			want: []string{`tether.yaml:8: tls.clientCAFile: needs tls.certFile and tls.keyFile`},
		},
		{
			name: "auth tokens",
			yaml: head + `listeners: {api: "[2001:db8::1]:9000"}
auth:
  tokens:
  - name: ops
    token: abc
    tokenFile: token.txt
    services: ["*"]
    access: admin
  - name: ops
    tokenFile: missing.txt
    services: [web, nope]
  - tokenFile: empty.txt
  - name: x
    token: ""
    services: [web]
  - name: y
    services: [web]
`,
			want: []string{
				`tether.yaml:8: listeners.api: [2001:db8::1]:9000 is not a loopback address: configure tls (certFile, keyFile), or set listeners.allowInsecure: true to serve it in plain text`,
				`tether.yaml:13: auth.tokens[0].tokenFile: set token or tokenFile, not both`,
				`tether.yaml:15: auth.tokens[0].access: "admin" is not one of read, write`,
				`tether.yaml:16: auth.tokens[1].name: duplicate token name "ops" (also auth.tokens[0])`,
				`tether.yaml:17: auth.tokens[1].tokenFile: cannot read token: open missing.txt: no such file or directory`,
				`tether.yaml:18: auth.tokens[1].services[1]: "nope" is not a configured service`,
				`tether.yaml:19: auth.tokens[2].name: required`,
				`tether.yaml:19: auth.tokens[2].tokenFile: empty.txt is empty`,
				`tether.yaml:19: auth.tokens[2].services: required: list service names or "*"`,
				`tether.yaml:21: auth.tokens[3].token: must not be empty`,
				`tether.yaml:23: auth.tokens[4]: set token or tokenFile`,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := config.Parse([]byte(tt.yaml), "tether.yaml")
			if err == nil {
				t.Fatalf("Parse succeeded (%+v), want errors", cfg)
			}
			if cfg != nil {
				t.Errorf("Parse returned a config with its errors")
			}
			if diff := cmp.Diff(tt.want, errorLines(t, err)); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseValid(t *testing.T) {
	fixtures(t)
	tests := []struct {
		name  string
		yaml  string
		check func(t *testing.T, c *config.Config)
	}{
		{
			name: "tls on every listener off loopback",
			yaml: head + "listeners: {extProc: 0.0.0.0:9002, xds: ':18000', sip: '[::]:9060', api: 127.0.0.1:9000}\n" +
				"tls: {certFile: rules.xml, keyFile: token.txt, clientCAFile: empty.txt}\nenvoy: {tls: {caFile: /etc/envoy/ca.pem}}\n",
			check: func(t *testing.T, c *config.Config) {
				want := config.TLS{CertFile: "rules.xml", KeyFile: "token.txt", ClientCAFile: "empty.txt"}
				if diff := cmp.Diff(want, c.TLS); diff != "" || !c.TLS.Enabled() || c.Envoy.TLS.CAFile != "/etc/envoy/ca.pem" {
					t.Errorf("tls (-want +got):\n%s", diff)
				}
			},
		},
		{
			name: "redis backend with Sentinel",
			yaml: head + "store:\n  backend: redis\n  redis: {addresses: ['127.0.0.1:26379', '127.0.0.1:26380'], masterSet: tether, passwordFile: token.txt, keyPrefix: 'fleet1:'}\n",
			check: func(t *testing.T, c *config.Config) {
				r := c.Store.Redis
				if c.Store.Backend != config.StoreRedis || len(r.Addresses) != 2 || r.MasterSet != "tether" || r.Password == "" ||
					r.KeyPrefix != "fleet1:" || r.TouchDelay != time.Second || r.LeaseTTL != 10*time.Second || r.DegradedFor != 15*time.Second ||
					r.HealthLeaseTTL != 5*time.Second || r.RegistryResync != 5*time.Second {
					t.Errorf("store: %+v", c.Store)
				}
			},
		},
		{
			name: "redis backend acknowledging on replicas",
			yaml: head + "store:\n  backend: redis\n  redis: {addresses: ['127.0.0.1:6379'], ackDurability: replica, ackReplicas: 2, ackTimeout: 20ms}\n",
			check: func(t *testing.T, c *config.Config) {
				r := c.Store.Redis
				if r.AckDurability != "replica" || r.AckReplicas != 2 || r.AckTimeout != 20*time.Millisecond {
					t.Errorf("store.redis: %+v", r)
				}
			},
		},
		{
			name: "api storeTimeout beside other api settings",
			yaml: head + "api: {storeTimeout: 5s, hosts: [tether.internal]}\n",
			check: func(t *testing.T, c *config.Config) {
				if diff := cmp.Diff(config.API{StoreTimeout: 5 * time.Second, Hosts: []string{"tether.internal"}}, c.API); diff != "" {
					t.Errorf("api (-want +got):\n%s", diff)
				}
			},
		},
		{
			name: "non-loopback api with allowInsecure",
			yaml: head + "listeners: {api: 0.0.0.0:9000, allowInsecure: true}\nauth: {allowInsecure: true}\n",
		},
		{
			name: "non-loopback api with a token file",
			yaml: head + "listeners: {api: 0.0.0.0:9000, allowInsecure: true}\nauth:\n  tokens:\n  - {name: ops, tokenFile: token.txt, services: [web], access: write}\n",
			check: func(t *testing.T, c *config.Config) {
				want := []config.Token{{Name: "ops", Token: "s3cret-from-file", TokenFile: "token.txt", Services: []string{"web"}, Access: "write"}}
				if diff := cmp.Diff(want, c.Auth.Tokens); diff != "" {
					t.Errorf("tokens (-want +got):\n%s", diff)
				}
			},
		},
		{
			name: "localhost and port 0 listeners, disabled listener, null values",
			yaml: head + "listeners: {api: 'localhost:0', xds: '127.0.0.1:0', sip: '', extProc: ~}\nstore:\n",
			check: func(t *testing.T, c *config.Config) {
				want := config.Listeners{ExtProc: "127.0.0.1:9002", XDS: "127.0.0.1:0", API: "localhost:0", SIP: ""}
				if diff := cmp.Diff(want, c.Listeners); diff != "" {
					t.Errorf("listeners (-want +got):\n%s", diff)
				}
			},
		},
		{
			name: "anchors and merge keys",
			yaml: `apiVersion: tether/v1
services:
- &base
  name: web
  affinity: cookie
  sessionTTL: 1h
  instances: &inst [{id: a, address: 10.0.0.1, ports: {http: 8081}}]
- <<: *base
  name: web2
  match: {pathPrefix: /two}
  instances: *inst
`,
			check: func(t *testing.T, c *config.Config) {
				s := c.Services[1]
				if s.Name != "web2" || s.Affinity != registry.AffinityCookie || s.SessionTTL != time.Hour || len(s.Instances) != 1 || s.Match.PathPrefix != "/two" {
					t.Errorf("merged service = %+v", s)
				}
			},
		},
		{
			name: "defaults capped by shorter explicit limits",
			yaml: head + "- name: b\n  match: {pathPrefix: /b}\n  sessionTTL: 10m\n  healthCheck: {interval: 50ms}\n",
			check: func(t *testing.T, c *config.Config) {
				s := c.Services[1]
				if s.IdleTimeout != 10*time.Minute || s.HealthCheck.Timeout != 50*time.Millisecond {
					t.Errorf("idleTimeout = %v, healthCheck.timeout = %v; want 10m, 50ms", s.IdleTimeout, s.HealthCheck.Timeout)
				}
			},
		},
		{
			name: "hash affinity defaults to consistent hashing, dcr file resolved",
			yaml: head + "- name: sip\n  match: {pathPrefix: /sip}\n  affinity: hash\n  dcrFile: rules.xml\n  hashBalanceFactor: 1.25\n  instances: [{id: s1, address: '2001:db8::5', ports: {sip: 5060}}]\n",
			check: func(t *testing.T, c *config.Config) {
				s := c.Services[1]
				if s.Balancing != registry.BalanceConsistentHash || s.DCRFile != "rules.xml" || s.HashBalanceFactor != 1.25 {
					t.Errorf("service = %+v", s)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := config.Parse([]byte(tt.yaml), "tether.yaml")
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if tt.check != nil {
				tt.check(t, c)
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	c, err := config.Parse([]byte(head), "tether.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := &config.Config{
		APIVersion: "tether/v1",
		Listeners:  config.Listeners{ExtProc: "127.0.0.1:9002", XDS: "127.0.0.1:18000", API: "127.0.0.1:9000", SIP: "127.0.0.1:9060"},
		Log:        config.Log{Format: "text", Level: "info"},
		API:        config.API{StoreTimeout: 2 * time.Second},
		Store: config.Store{SnapshotInterval: 30 * time.Second, Retention: 24 * time.Hour, OnCorruptSnapshot: config.SnapshotFail,
			Backend: config.StoreMemory, Redis: config.RedisStore{KeyPrefix: "tether:", TouchDelay: time.Second, LeaseTTL: 10 * time.Second,
				DegradedFor: 15 * time.Second, HealthLeaseTTL: 5 * time.Second, RegistryResync: 5 * time.Second,
				AckDurability: "none", AckReplicas: 1, AckTimeout: 50 * time.Millisecond}},
		ExtProc: config.ExtProc{
			DestinationHeader:   "x-gateway-destination-endpoint",
			MetadataNamespace:   "envoy.lb",
			ServedHostKey:       "x-gateway-destination-endpoint-served",
			MessageTimeout:      500 * time.Millisecond,
			MaxRequestLifetime:  time.Hour,
			BodyMode:            "none",
			FirstMessageTimeout: 10 * time.Second,
		},
		NewSessions: config.NewSessions{ProvisionalIdleTimeout: 30 * time.Second, PerClientRate: 2, PerClientBurst: 20,
			TrustedNetworks: []string{"127.0.0.0/8", "::1/128"}, PerClientMaxSessions: 40, PerServiceShare: 0.25, WideBucketFactor: 4},
		Envoy: config.Envoy{ListenerAddress: "0.0.0.0:10000", AdminAddress: "127.0.0.1:9901", ReplicaMode: config.ReplicasActiveActive},
		Discovery: config.Discovery{XDS: config.XDSConnection{NodeID: "tether", NodeCluster: "tether"},
			GatewayAPI: config.GatewayAPISource{ControllerName: config.DefaultGatewayControllerName}},
		Autoscaling: config.Autoscaling{ScaleInAfter: 5 * time.Minute,
			Webhook: config.Webhook{Timeout: 10 * time.Second, MaxAttempts: 6}},
		Runtime:  config.Runtime{GCHeapFloorMiB: config.DefaultGCHeapFloorMiB},
		Shutdown: config.Shutdown{DrainTimeout: config.DefaultDrainTimeout},
		Services: []config.Service{{
			Name:                    "web",
			Match:                   config.Match{PathPrefix: "/"},
			Affinity:                registry.AffinityNone,
			Balancing:               registry.BalanceRoundRobin,
			SessionsPerInstance:     20,
			RequestSlotsPerInstance: 200,
			StreamsPerInstance:      100,
			SessionTTL:              6 * time.Hour,
			IdleTimeout:             30 * time.Minute,
			Cookie:                  config.Cookie{Name: "tether-session", Path: "/", HTTPOnly: true, SameSite: "Lax", Lifetime: "permanent"},
			HeaderField:             "x-tether-session",
			SSE:                     config.SSE{Path: "/sse", SessionParam: "sessionId"},
			Upstream:                config.Upstream{Protocol: "http1", ConnectTimeout: 2 * time.Second},
			Calls:                   config.Calls{TTL: 2 * time.Hour, SetupTTL: 5 * time.Minute},
			MCPHandle:               config.MCPHandle{LearnHeader: "Mcp-Handle", PrefixSeparator: ":"},
			HealthCheck:             config.HealthCheck{Path: "/healthz", Timeout: time.Second, HealthyThreshold: 2, UnhealthyThreshold: 3},
			Instances: []config.Instance{{
				ID: "a", Address: "10.0.0.1", Ports: config.Ports{HTTP: 8081}, Weight: 1, State: registry.StateActive,
			}},
			Discovery: config.ServiceDiscovery{
				Kubernetes: config.KubernetesSource{Ports: config.PortNames{HTTP: "http"}},
				DNS:        config.DNSSource{Type: "A", MinRefresh: time.Second, MaxRefresh: 5 * time.Minute},
			},
		}},
		File: "tether.yaml",
	}
	if diff := cmp.Diff(want, c); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
	if got := c.Log.SlogLevel().String(); got != "INFO" {
		t.Errorf("SlogLevel = %s, want INFO", got)
	}
}

func TestTokenDefaultsToRead(t *testing.T) {
	c, err := config.Parse([]byte(head+"auth:\n  tokens: [{name: a, token: t, services: ['*']}]\n"), "tether.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Auth.Tokens[0].Access; got != config.AccessRead {
		t.Errorf("access = %q, want %q", got, config.AccessRead)
	}
}

func TestLoadResolvesPathsAgainstTheConfigDir(t *testing.T) {
	t.Chdir(t.TempDir())
	if err := os.MkdirAll("conf", 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{
		"conf/rules.xml": "<rules/>",
		"conf/tok":       "tok\n",
		"conf/tether.yaml": head + "  dcrFile: rules.xml\nstore: {snapshotPath: state/sessions.snap}\n" +
			"auth:\n  tokens: [{name: a, tokenFile: tok, services: ['*']}]\n",
	} {
		if err := os.WriteFile(name, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c, err := config.Load("conf/tether.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got := []string{c.Services[0].DCRFile, c.Store.SnapshotPath, c.Auth.Tokens[0].TokenFile, c.Auth.Tokens[0].Token}
	want := []string{"conf/rules.xml", "conf/state/sessions.snap", "conf/tok", "tok"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("resolved paths (-want +got):\n%s", diff)
	}
	abs, _ := filepath.Abs("conf/rules.xml")
	c, err = config.Parse([]byte(head+"  dcrFile: "+abs+"\n"), "elsewhere/tether.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Services[0].DCRFile != abs {
		t.Errorf("absolute dcrFile = %q, want %q", c.Services[0].DCRFile, abs)
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := config.Load(filepath.Join(t.TempDir(), "nope.yaml"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(missing) = %v, want an error wrapping os.ErrNotExist", err)
	}
}

func TestRegistry(t *testing.T) {
	c, err := config.Parse([]byte(`apiVersion: tether/v1
extProc: {bodyMode: full-duplex}
services:
- name: web
  match: {authorities: [a.example], pathPrefix: /w}
  affinity: cookie
  balancing: sticky-round-robin
  sessionsPerInstance: 5
  requestSlotsPerInstance: 7
  sessionTTL: 1h
  idleTimeout: 1m
  maxLifetime: 2h
  disableSessionIdReuse: true
  cookie: {name: c, path: /w, secure: true, httpOnly: false, sameSite: None, lifetime: session}
  sticky: {upstreamCookie: JSESSIONID}
  headerField: x-session
  sse: {path: /w/sse, sessionParam: session_id}
  upstream: {protocol: http2, connectTimeout: 3s}
  healthCheck: {path: /hz, interval: 1s, timeout: 100ms, healthyThreshold: 1, unhealthyThreshold: 4}
  instances:
  - {id: b, address: 10.0.0.2, ports: {http: 80}, weight: 3, zone: z1, state: standby}
  - {id: a, address: 10.0.0.1, ports: {http: 80}}
- name: calls
  match: {pathPrefix: /c}
  affinity: hash
  hashBalanceFactor: 1.5
  bodyMode: none
  instances: [{id: s, address: 10.0.0.3, ports: {sip: 5060}}]
`), "tether.yaml")
	if err != nil {
		t.Fatal(err)
	}
	svcs, ins := c.Registry()
	wantSvcs := []registry.Service{
		{
			Name:                    "web",
			Match:                   registry.Match{Authorities: []string{"a.example"}, PathPrefix: "/w"},
			Affinity:                registry.AffinityCookie,
			Balancing:               registry.BalanceStickyRoundRobin,
			SessionsPerInstance:     5,
			RequestSlotsPerInstance: 7,
			SessionTTL:              time.Hour,
			IdleTimeout:             time.Minute,
			MaxLifetime:             2 * time.Hour,
			DisableSessionIDReuse:   true,
			Cookie:                  registry.Cookie{Name: "c", Path: "/w", Secure: true, SameSite: "None", SessionLifetime: true},
			Sticky:                  registry.Sticky{UpstreamCookie: "JSESSIONID"},
			HeaderField:             "x-session",
			SSE:                     registry.SSE{Path: "/w/sse", SessionParam: "session_id"},
			UpstreamHTTP2:           true,
			FullDuplexBodies:        true, // extProc.bodyMode, inherited
			ConnectTimeout:          3 * time.Second,
			HealthCheck:             registry.HealthCheck{Path: "/hz", Interval: time.Second, Timeout: 100 * time.Millisecond, HealthyThreshold: 1, UnhealthyThreshold: 4},
		},
		{
			Name:                    "calls",
			Match:                   registry.Match{PathPrefix: "/c"},
			Affinity:                registry.AffinityHash,
			Balancing:               registry.BalanceConsistentHash,
			SessionsPerInstance:     20,
			RequestSlotsPerInstance: 200,
			SessionTTL:              6 * time.Hour,
			IdleTimeout:             30 * time.Minute,
			Cookie:                  registry.Cookie{Name: "tether-session", Path: "/", HTTPOnly: true, SameSite: "Lax"},
			HeaderField:             "x-tether-session",
			SSE:                     registry.SSE{Path: "/sse", SessionParam: "sessionId"},
			HashBalanceFactor:       1.5,
			ConnectTimeout:          2 * time.Second,
			HealthCheck:             registry.HealthCheck{Path: "/healthz", Timeout: time.Second, HealthyThreshold: 2, UnhealthyThreshold: 3},
		},
	}
	wantIns := []registry.Instance{
		{Service: "web", ID: "b", Address: "10.0.0.2", HTTPPort: 80, Weight: 3, Zone: "z1", State: registry.StateStandby},
		{Service: "web", ID: "a", Address: "10.0.0.1", HTTPPort: 80, Weight: 1, State: registry.StateActive},
		{Service: "calls", ID: "s", Address: "10.0.0.3", SIPPort: 5060, Weight: 1, State: registry.StateActive},
	}
	if diff := cmp.Diff(wantSvcs, svcs); diff != "" {
		t.Errorf("services (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantIns, ins); diff != "" {
		t.Errorf("instances (-want +got):\n%s", diff)
	}
	// The mapping is accepted by the registry as is.
	reg := registry.New()
	if err := reg.Apply(svcs, ins); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if got := len(reg.Snapshot().Instances("web")); got != 2 {
		t.Errorf("registry has %d web instances, want 2", got)
	}
}

func TestTokenLogValueHidesSecret(t *testing.T) {
	tok := config.Token{Name: "ops", Token: "hunter2", Services: []string{"*"}, Access: "write"}
	if s := tok.LogValue().String(); strings.Contains(s, "hunter2") || !strings.Contains(s, "ops") {
		t.Errorf("LogValue = %s; want the name and not the secret", s)
	}
}

// TestInstanceAddressesCanonical: instance addresses are stored in the form Envoy prints a host
// (inet_ntop for IPv6), with or without URL brackets, so the ip:port tether sends for
// override_host is byte-identical to the EDS host's and the two spellings of one address are one
// endpoint.
func TestInstanceAddressesCanonical(t *testing.T) {
	for _, tc := range []struct{ in, addr, httpAddr string }{
		{"'fd00::0:2'", "fd00::2", "[fd00::2]:8081"},
		{"'[fd00::2]'", "fd00::2", "[fd00::2]:8081"},
		{"2001:DB8:0::1", "2001:db8::1", "[2001:db8::1]:8081"},
		{"'[2001:db8:0:0:0:0:0:1]'", "2001:db8::1", "[2001:db8::1]:8081"},
		{"'::FFFF:10.0.0.1'", "::ffff:10.0.0.1", "[::ffff:10.0.0.1]:8081"},
		{"10.0.0.1", "10.0.0.1", "10.0.0.1:8081"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			cfg, err := config.Parse([]byte(strings.Replace(head, "address: 10.0.0.1", "address: "+tc.in, 1)), "t.yaml")
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.Services[0].Instances[0].Address; got != tc.addr {
				t.Errorf("address = %q, want %q", got, tc.addr)
			}
			_, ins := cfg.Registry()
			if got := ins[0].HTTPAddr(); got != tc.httpAddr {
				t.Errorf("HTTPAddr = %q, want %q", got, tc.httpAddr)
			}
		})
	}
	// Two spellings of one address and port are one endpoint: a duplicate.
	dup := head + "  - id: b\n    address: '[0:0::1]'\n    ports: {http: 8081}\n"
	dup = strings.Replace(dup, "address: 10.0.0.1", "address: '::1'", 1) + "registry: {allowedNetworks: ['::1/128']}\n"
	if _, err := config.Parse([]byte(dup), "t.yaml"); err == nil || !strings.Contains(err.Error(), "[::1]:8081 is already used") {
		t.Errorf("duplicate through another spelling: err = %v", err)
	}
	for _, bad := range []string{"'[::1'", "'[fe80::1%eth0]'", "'[]'", "'[10.0.0.1]:80'"} {
		if _, err := config.Parse([]byte(strings.Replace(head, "address: 10.0.0.1", "address: "+bad, 1)), "t.yaml"); err == nil {
			t.Errorf("address %s: no error", bad)
		}
	}
}

func TestEnvoyReplicas(t *testing.T) {
	two := "envoy:\n  replicas:\n  - {xds: '10.0.0.1:18000', extProc: '10.0.0.1:9002'}\n  - {xds: 'tether-b.internal:18000', extProc: '[2001:DB8::2]:9002'}\n"
	cfg, err := config.Parse([]byte(head+two+"  replicaMode: active-standby\n"), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := []config.Replica{{XDS: "10.0.0.1:18000", ExtProc: "10.0.0.1:9002"}, {XDS: "tether-b.internal:18000", ExtProc: "[2001:DB8::2]:9002"}}
	if d := cmp.Diff(want, cfg.Envoy.Replicas); d != "" || cfg.Envoy.ReplicaMode != config.ReplicasActiveStandby {
		t.Errorf("replicas (-want +got):\n%s mode %q", d, cfg.Envoy.ReplicaMode)
	}
	for _, tc := range []struct{ yaml, msg string }{
		{"envoy: {replicaMode: active-standby}\n", "needs at least two envoy.replicas"},
		{"envoy: {replicaMode: hot}\n", `"hot" must be active-active or active-standby`},
		{"envoy:\n  replicas: [{xds: '0.0.0.0:18000', extProc: '10.0.0.1:9002'}]\n", "envoy.replicas[0].xds: \"0.0.0.0:18000\" is not an address Envoy can dial"},
		{"envoy:\n  replicas: [{xds: '10.0.0.1:0', extProc: '10.0.0.1:9002'}]\n", "envoy.replicas[0].xds: \"10.0.0.1:0\" is not an address Envoy can dial"},
		{"envoy:\n  replicas: [{xds: '10.0.0.1:18000'}]\n", "envoy.replicas[0].extProc: required"},
		{"envoy:\n  replicas:\n  - {xds: '[::1]:18000', extProc: '10.0.0.1:9002'}\n  - {xds: '[0::1]:18000', extProc: '10.0.0.2:9002'}\n", "[::1]:18000 is already listed as envoy.replicas[0].xds"},
	} {
		_, err := config.Parse([]byte(head+tc.yaml), "t.yaml")
		if err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%q: err = %v, want %q", tc.yaml, err, tc.msg)
		}
	}
}

// TestInstanceAddressPolicy is #25 finding 4 in the config file: the finding's addresses are
// refused with the reason on their line whatever registry.allowedNetworks lists, loopback only
// when listed, and a bad prefix is an error.
func TestInstanceAddressPolicy(t *testing.T) {
	for _, tc := range []struct{ addr, port, allowed, want string }{
		{"127.0.0.1", "9901", "[127.0.0.1/32]", "port 9901 is envoy.adminAddress's"},
		{"127.0.0.1", "9000", "[127.0.0.1/32]", "port 9000 is listeners.api's"},
		{"169.254.169.254", "80", "[0.0.0.0/0]", "a cloud metadata address"},
		{"224.0.0.1", "80", "[0.0.0.0/0]", "multicast"},
		{"255.255.255.255", "80", "[0.0.0.0/0]", "the broadcast address"},
		{"fe80::1", "80", "['::/0']", "link-local"},
		{"'::ffff:169.254.169.254'", "80", "['::/0', 0.0.0.0/0]", "a cloud metadata address (IPv4-mapped)"},
		{"'::ffff:0.0.0.0'", "80", "['::/0', 0.0.0.0/0]", "the unspecified address (IPv4-mapped)"},
		{"127.0.0.1", "8080", "[]", "loopback: allowed only when registry.allowedNetworks lists it"},
		{"127.0.0.1", "8080", "[0.0.0.0/0]", "loopback: allowed only when"},
		{"10.0.0.1", "8080", "[192.168.0.0/16]", "outside registry.allowedNetworks [192.168.0.0/16]"},
		{"127.0.0.1", "8080", "[127.0.0.1/32]", ""},
		{"10.0.0.1", "8080", "[]", ""},
		{"10.0.0.1", "8080", "[banana]", `registry.allowedNetworks[0]: "banana" is not a CIDR prefix`},
	} {
		t.Run(tc.addr+":"+tc.port+" "+tc.allowed, func(t *testing.T) {
			doc := fmt.Sprintf("apiVersion: tether/v1\nregistry: {allowedNetworks: %s}\nservices:\n- name: web\n  instances:\n  - {id: a, address: %s, ports: {http: %s}}\n",
				tc.allowed, tc.addr, tc.port)
			_, err := config.Parse([]byte(doc), "t.yaml")
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestParseRefusesNonUTF8: a UTF-16 file (the fuzzer's find: YAML read it, with line numbers
// that were not the file's) and invalid UTF-8 are refused on the offending line.
func TestParseRefusesNonUTF8(t *testing.T) {
	for _, tc := range []struct {
		data string
		want string
	}{
		{"\xfe\xff (00", "t.yaml:1: a config file must be UTF-8 text"},
		{"\xff\xfea\x00:\x00", "t.yaml:1: a config file must be UTF-8 text"},
		{"apiVersion: tether/v1\n# caf\xe9\n", "t.yaml:2: a config file must be UTF-8 text"},
	} {
		if _, err := config.Parse([]byte(tc.data), "t.yaml"); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) = %v, want %q", tc.data, err, tc.want)
		}
	}
}
