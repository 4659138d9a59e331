package kubetest

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

// The versions kubetest looks for are the ones .ci/kubebins.sh builds from the helper modules.
func TestVersionsMatchHelperModules(t *testing.T) {
	for file, want := range map[string]string{
		"apiserver/go.mod": `(?m)^(require)?\s*k8s\.io/kubernetes ` + regexp.QuoteMeta(KubernetesVersion) + `$`,
		"etcd/go.mod":      `(?m)^(require)?\s*go\.etcd\.io/etcd/server/v3 ` + regexp.QuoteMeta(EtcdVersion) + `$`,
	} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(want).Match(b) {
			t.Errorf("%s does not match %s", file, want)
		}
	}
}

func TestServer(t *testing.T) {
	s := Shared(t)
	ctx := context.Background()
	ns := s.Namespace(t, "kubetest")

	// The admin creates objects; the API server validates them (loopback endpoints are refused).
	slice := `{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"s"},` +
		`"addressType":"IPv4","endpoints":[{"addresses":["127.0.0.1"]}]}`
	_, err := s.Do(ctx, http.MethodPost, "/apis/discovery.k8s.io/v1/namespaces/"+ns+"/endpointslices", []byte(slice))
	if err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("loopback endpoint: got %v, want the API server's refusal", err)
	}

	// kubectl reaches it through the kubeconfig.
	out, err := s.Kubectl(ctx, "get", "namespace", ns, "-o", "jsonpath={.metadata.name}")
	if err != nil {
		t.Fatalf("kubectl: %v: %s", err, out)
	}
	if string(out) != ns {
		t.Fatalf("kubectl get namespace: %q, want %q", out, ns)
	}

	// The "tether" user may do nothing until granted, then exactly what was granted.
	canList := func() bool {
		out, err := kubectlAs(ctx, s, "auth", "can-i", "list", "endpointslices.discovery.k8s.io", "-n", ns)
		return err == nil && strings.TrimSpace(string(out)) == "yes"
	}
	if canList() {
		t.Fatal("user tether can list endpointslices before any grant")
	}
	s.Grant(t, ns, `[{"apiGroups":["discovery.k8s.io"],"resources":["endpointslices"],"verbs":["list"]}]`)
	if !canList() {
		t.Fatal("user tether cannot list endpointslices after the grant")
	}

	var v struct{ GitVersion string }
	b, err := s.Do(ctx, http.MethodGet, "/version", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(v.GitVersion, "v1.37") {
		t.Errorf("version %q, want v1.37.x", v.GitVersion)
	}
}

func kubectlAs(ctx context.Context, s *Server, args ...string) ([]byte, error) {
	u := *s
	u.Kubeconfig = s.UserKubeconfig
	return u.Kubectl(ctx, args...)
}

// A test host is reachable from the test at its address, serves from inside its own network
// namespace (the request arrives from the veth peer), and is gone when the test ends.
func TestHost(t *testing.T) {
	var name string
	t.Run("serve", func(t *testing.T) {
		h := NewHost(t)
		name = h.Name
		var ln net.Listener
		if err := h.Do(func() (err error) {
			ln, err = net.Listen("tcp", net.JoinHostPort(h.Addr.String(), "8080"))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		var peers []string
		var mu sync.Mutex
		srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			peers = append(peers, r.RemoteAddr)
			mu.Unlock()
			_, _ = io.WriteString(w, "in "+h.Name)
		})}
		go func() { _ = srv.Serve(ln) }()
		defer func() { _ = srv.Close() }()
		resp, err := http.Get("http://" + ln.Addr().String() + "/")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if string(b) != "in "+h.Name {
			t.Fatalf("answer %q", b)
		}
		if host, _, _ := net.SplitHostPort(peers[0]); host != h.Peer.String() {
			t.Errorf("request came from %s, want the veth peer %s", host, h.Peer)
		}
	})
	if out, _ := exec.Command("ip", "netns", "list").CombinedOutput(); strings.Contains(string(out), name) {
		t.Errorf("namespace %s still there after the test: %s", name, out)
	}
}
