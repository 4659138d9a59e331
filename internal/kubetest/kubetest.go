// Package kubetest runs a real Kubernetes API server for tests: etcd and kube-apiserver, both
// built from the Go module proxy by .ci/kubebins.sh (their modules are internal/kubetest/etcd
// and internal/kubetest/apiserver, outside tether's go.mod) and cached outside the repository.
//
// No controllers run (no controller-manager, scheduler or kubelet): tests create the objects
// they need (Services, EndpointSlices, CRDs and their objects) through the API. The server
// authenticates two static tokens and authorizes with RBAC: an administrator in system:masters
// (Token, Kubeconfig) and a user "tether" in no group (UserToken, UserKubeconfig) that may do
// only what a test grants it, so a test proves which RBAC rules a component needs.
//
// A test whose binaries are missing is skipped, or fails when the CI environment variable is set
// (`make test`), with the command that builds them.
//
// Endpoints for EndpointSlices (which refuse loopback addresses) are test hosts in network
// namespaces the test makes (NewHost: root and iproute2; skipped only in -short runs); the
// Gateway API CRDs install from the module cache (Server.InstallGatewayAPI).
package kubetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Versions of the binaries kubetest runs; .ci/kubebins.sh reads the same versions from the
// helper modules' go.mod files. A test in this package keeps the two in step.
const (
	KubernetesVersion = "v1.37.2"
	EtcdVersion       = "v3.7.3"
)

// BinDir is where .ci/kubebins.sh caches the binaries: $TETHER_KUBE_CACHE, or
// $HOME/.cache/tether/kube.
func BinDir() string {
	if d := os.Getenv("TETHER_KUBE_CACHE"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = os.TempDir()
	}
	return filepath.Join(home, ".cache", "tether", "kube")
}

// APIServerBin and EtcdBin are the cached binaries' paths.
func APIServerBin() string { return filepath.Join(BinDir(), KubernetesVersion, "kube-apiserver") }

// EtcdBin is the cached etcd binary's path.
func EtcdBin() string { return filepath.Join(BinDir(), "etcd-"+EtcdVersion, "etcd") }

// Server is a running API server. Its fields are read-only.
type Server struct {
	// URL is the API server's https URL on 127.0.0.1.
	URL string
	// Token is a bearer token of a user in system:masters.
	Token string
	// CAData is the PEM certificate that signs (is) the server's serving certificate.
	CAData []byte
	// Kubeconfig is the path of a kubeconfig file (for kubectl and client-go) that reaches URL
	// as the system:masters user; its context is "kubetest".
	Kubeconfig string
	// UserToken and UserKubeconfig are the same for the user "tether", who has no permissions
	// until a test binds it a Role or ClusterRole (see Server.Grant).
	UserToken      string
	UserKubeconfig string

	dir    string
	client *http.Client
	stop   func()
}

// Require skips tb when the binaries are missing, or fails it when CI is set.
func Require(tb testing.TB) {
	tb.Helper()
	var missing []string
	for _, bin := range []string{EtcdBin(), APIServerBin()} {
		if _, err := os.Stat(bin); err != nil {
			missing = append(missing, bin)
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := fmt.Sprintf("kubetest: missing %s; build them with .ci/kubebins.sh (part of make deps)", strings.Join(missing, ", "))
	if os.Getenv("CI") != "" {
		tb.Fatal(msg)
	}
	tb.Skip(msg)
}

// Start runs a new etcd and kube-apiserver for tb, waits until /readyz answers ok, and stops
// both when tb ends. Starting takes 10–20 s; packages with several tests share one server with
// Shared.
func Start(tb testing.TB) *Server {
	tb.Helper()
	if testing.Short() {
		tb.Skip("kubetest: a real kube-apiserver is not started in -short runs")
	}
	Require(tb)
	s, err := start(tb.TempDir())
	if err != nil {
		tb.Fatalf("kubetest: %v", err)
	}
	tb.Cleanup(s.stop)
	return s
}

var shared struct {
	once sync.Once
	s    *Server
	err  error
	dir  string
}

// Shared returns the package's one server, started on first use and stopped by Main. Tests that
// share it keep to their own namespaces (see Namespace).
func Shared(tb testing.TB) *Server {
	tb.Helper()
	if testing.Short() {
		tb.Skip("kubetest: a real kube-apiserver is not started in -short runs")
	}
	Require(tb)
	shared.once.Do(func() {
		shared.dir, shared.err = os.MkdirTemp("", "kubetest-")
		if shared.err == nil {
			shared.s, shared.err = start(shared.dir)
		}
	})
	if shared.err != nil {
		tb.Fatalf("kubetest: %v", shared.err)
	}
	return shared.s
}

// Main runs the package's tests (call it from TestMain) and then stops the Shared server if one
// was started.
func Main(m *testing.M) int {
	code := m.Run()
	if shared.s != nil {
		shared.s.stop()
	}
	if shared.dir != "" {
		_ = os.RemoveAll(shared.dir)
	}
	return code
}

// Namespace creates a namespace with a name unique to this server and returns it; it is deleted
// when tb ends (without waiting: no controller finalizes it).
func (s *Server) Namespace(tb testing.TB, prefix string) string {
	tb.Helper()
	name := prefix + "-" + mustHex(tb, 4)
	body := fmt.Sprintf(`{"apiVersion":"v1","kind":"Namespace","metadata":{"name":%q}}`, name)
	if _, err := s.Do(context.Background(), http.MethodPost, "/api/v1/namespaces", []byte(body)); err != nil {
		tb.Fatalf("kubetest: create namespace: %v", err)
	}
	tb.Cleanup(func() {
		_, _ = s.Do(context.Background(), http.MethodDelete, "/api/v1/namespaces/"+name, nil)
	})
	return name
}

// Grant binds the user "tether" to a ClusterRole with rules (JSON array of PolicyRule) for tb's
// duration: cluster-wide when namespace is "", else through a RoleBinding in namespace.
func (s *Server) Grant(tb testing.TB, namespace, rulesJSON string) {
	tb.Helper()
	name := "kubetest-grant-" + mustHex(tb, 4)
	ctx := context.Background()
	role := fmt.Sprintf(`{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRole","metadata":{"name":%q},"rules":%s}`, name, rulesJSON)
	if _, err := s.Do(ctx, http.MethodPost, "/apis/rbac.authorization.k8s.io/v1/clusterroles", []byte(role)); err != nil {
		tb.Fatalf("kubetest: grant: %v", err)
	}
	tb.Cleanup(func() {
		_, _ = s.Do(ctx, http.MethodDelete, "/apis/rbac.authorization.k8s.io/v1/clusterroles/"+name, nil)
	})
	kind, path := "ClusterRoleBinding", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"
	meta := fmt.Sprintf(`{"name":%q}`, name)
	if namespace != "" {
		kind, path = "RoleBinding", "/apis/rbac.authorization.k8s.io/v1/namespaces/"+namespace+"/rolebindings"
		meta = fmt.Sprintf(`{"name":%q,"namespace":%q}`, name, namespace)
	}
	binding := fmt.Sprintf(`{"apiVersion":"rbac.authorization.k8s.io/v1","kind":%q,"metadata":%s,`+
		`"roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"ClusterRole","name":%q},`+
		`"subjects":[{"apiGroup":"rbac.authorization.k8s.io","kind":"User","name":"tether"}]}`, kind, meta, name)
	if _, err := s.Do(ctx, http.MethodPost, path, []byte(binding)); err != nil {
		tb.Fatalf("kubetest: grant: %v", err)
	}
	tb.Cleanup(func() { _, _ = s.Do(ctx, http.MethodDelete, path+"/"+name, nil) })
}

func mustHex(tb testing.TB, n int) string {
	tb.Helper()
	h, err := randomHex(n)
	if err != nil {
		tb.Fatal(err)
	}
	return h
}

// Do sends one JSON request to the API server as the system:masters user and returns the body
// of a 2xx answer, or an error carrying the status and body otherwise.
func (s *Server) Do(ctx context.Context, method, path string, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, s.URL+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+s.Token)
	req.Header.Set("Accept", "application/json")
	switch method {
	case http.MethodPatch:
		req.Header.Set("Content-Type", "application/merge-patch+json")
	default:
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	var out bytes.Buffer
	if _, err := out.ReadFrom(resp.Body); err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		return nil, &StatusError{Code: resp.StatusCode, Body: out.String()}
	}
	return out.Bytes(), nil
}

// StatusError is a non-2xx answer from the API server.
type StatusError struct {
	Code int
	Body string
}

func (e *StatusError) Error() string { return fmt.Sprintf("status %d: %s", e.Code, e.Body) }

// IsNotFound reports whether err is a 404 from the API server.
func IsNotFound(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Code == http.StatusNotFound
}

// Kubectl runs the kubectl binary (Debian's package) against the server with args and returns
// its combined output.
func (s *Server) Kubectl(ctx context.Context, args ...string) ([]byte, error) {
	bin, err := exec.LookPath("kubectl")
	if err != nil {
		return nil, fmt.Errorf("kubectl: %w (apt-get install kubectl)", err)
	}
	cmd := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", s.Kubeconfig}, args...)...)
	return cmd.CombinedOutput()
}

func start(dir string) (*Server, error) {
	token, err := randomHex(16)
	if err != nil {
		return nil, err
	}
	userToken, err := randomHex(16)
	if err != nil {
		return nil, err
	}
	if err := writeFiles(dir, token, userToken); err != nil {
		return nil, err
	}
	var lastErr error
	// Ports are picked free and then passed on the command line (neither binary can report a
	// port it chose itself), so another process may take one in between: retry a few times.
	for attempt := 0; attempt < 3; attempt++ {
		s, err := startOnce(dir, token)
		if err == nil {
			s.UserToken = userToken
			s.UserKubeconfig = filepath.Join(dir, "kubeconfig-user")
			if err := os.WriteFile(s.UserKubeconfig, s.kubeconfigFor("tether", userToken), 0o600); err != nil {
				s.stop()
				return nil, err
			}
			return s, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

func startOnce(dir, token string) (*Server, error) {
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	clientURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	dataDir := filepath.Join(dir, "etcd-"+strconv.Itoa(ports[0]))
	etcd, err := startProc(dir, "etcd", EtcdBin(),
		"--name=kubetest",
		"--data-dir="+dataDir,
		"--listen-client-urls="+clientURL,
		"--advertise-client-urls="+clientURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=kubetest="+peerURL,
		"--unsafe-no-fsync",
		"--log-level=warn",
	)
	if err != nil {
		return nil, err
	}
	certDir := filepath.Join(dir, "certs")
	api, err := startProc(dir, "kube-apiserver", APIServerBin(),
		"--etcd-servers="+clientURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(ports[2]),
		"--endpoint-reconciler-type=none",
		"--cert-dir="+certDir,
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+filepath.Join(dir, "sa.crt"),
		"--service-account-signing-key-file="+filepath.Join(dir, "sa.key"),
		"--token-auth-file="+filepath.Join(dir, "tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-cluster-ip-range=10.96.0.0/16",
		"--enable-priority-and-fairness=false",
		"-v=0",
	)
	if err != nil {
		etcd.kill()
		return nil, err
	}
	stop := func() {
		api.kill()
		etcd.kill()
	}
	url := "https://127.0.0.1:" + strconv.Itoa(ports[2])
	ca, err := waitReady(url, token, certDir, api, etcd)
	if err != nil {
		stop()
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	s := &Server{
		URL:    url,
		Token:  token,
		CAData: ca,
		dir:    dir,
		client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}},
		stop:   stop,
	}
	s.Kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(s.Kubeconfig, s.kubeconfigFor("admin", token), 0o600); err != nil {
		stop()
		return nil, err
	}
	return s, nil
}

func (s *Server) kubeconfigFor(user, token string) []byte {
	return fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: kubetest
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: %[4]s
  user:
    token: %[3]s
contexts:
- name: kubetest
  context:
    cluster: kubetest
    user: %[4]s
    namespace: default
current-context: kubetest
`, s.URL, base64.StdEncoding.EncodeToString(s.CAData), token, user)
}

// waitReady polls /readyz until it answers ok, either process exits, or a minute passes. It
// returns the serving certificate the API server wrote into certDir.
func waitReady(url, token, certDir string, procs ...*proc) ([]byte, error) {
	deadline := time.Now().Add(90 * time.Second)
	insecure := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		// Only until the self-signed certificate exists on disk; it is pinned right after.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // see above
	}}
	var last string
	for time.Now().Before(deadline) {
		for _, p := range procs {
			if p.exited() {
				return nil, fmt.Errorf("%s exited before the API server was ready: %s", p.name, p.tail())
			}
		}
		req, _ := http.NewRequest(http.MethodGet, url+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := insecure.Do(req)
		if err == nil {
			var b bytes.Buffer
			_, _ = b.ReadFrom(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				ca, err := os.ReadFile(filepath.Join(certDir, "apiserver.crt"))
				if err != nil {
					return nil, fmt.Errorf("serving certificate: %w", err)
				}
				return ca, nil
			}
			last = fmt.Sprintf("readyz %d: %s", resp.StatusCode, lastLines(b.String(), 5))
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond) // polling an external process's readiness
	}
	return nil, fmt.Errorf("API server not ready within 90s: %s; kube-apiserver: %s", last, procs[0].tail())
}

// writeFiles writes the service-account key pair and the token file.
func writeFiles(dir, token, userToken string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})
	for name, data := range map[string][]byte{
		"sa.key":     keyPEM,
		"sa.crt":     pubPEM,
		"tokens.csv": []byte(token + ",kubetest-admin,kubetest-admin,system:masters\n" + userToken + ",tether,tether\n"),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return err
		}
	}
	return nil
}

func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}
