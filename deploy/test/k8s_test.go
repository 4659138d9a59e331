package deploytest

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

// object is one decoded manifest document.
type object struct {
	Kind, Name string
	Obj        runtime.Object
	YAML       []byte
}

// k8sScheme knows the built-in kinds and prometheus-operator's ServiceMonitor.
func k8sScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{scheme.AddToScheme, monitoringv1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// decodeStrict splits a multi-document YAML stream and decodes every non-empty document
// strictly (unknown or duplicate fields, wrong case, wrong types are errors) into its typed
// Kubernetes Go type; a kind the scheme does not know is an error too.
func decodeStrict(t *testing.T, what string, stream []byte) []object {
	t.Helper()
	s := k8sScheme(t)
	ser := kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, s, s, kjson.SerializerOptions{Yaml: true, Strict: true})
	var out []object
	for i, doc := range splitYAML(stream) {
		obj, gvk, err := ser.Decode(doc, nil, nil)
		if err != nil {
			t.Errorf("%s: document %d: %v\n%s", what, i, err, doc)
			continue
		}
		m, err := meta(obj)
		if err != nil {
			t.Errorf("%s: document %d: %v", what, i, err)
			continue
		}
		out = append(out, object{Kind: gvk.Kind, Name: m, Obj: obj, YAML: doc})
	}
	return out
}

func meta(obj runtime.Object) (string, error) {
	v := reflect.ValueOf(obj).Elem().FieldByName("ObjectMeta")
	if !v.IsValid() {
		return "", fmt.Errorf("%T has no metadata", obj)
	}
	name := v.FieldByName("Name").String()
	if name == "" {
		return "", fmt.Errorf("%T without a name", obj)
	}
	return name, nil
}

// splitYAML splits a YAML stream at document separators, dropping empty documents.
func splitYAML(stream []byte) [][]byte {
	var docs [][]byte
	for _, d := range bytes.Split(append([]byte("\n"), stream...), []byte("\n---")) {
		if len(bytes.TrimSpace(stripComments(d))) > 0 {
			docs = append(docs, d)
		}
	}
	return docs
}

func stripComments(b []byte) []byte {
	var out [][]byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("#")) {
			out = append(out, l)
		}
	}
	return bytes.Join(out, []byte("\n"))
}

func find[T runtime.Object](t *testing.T, objs []object, kind string) []T {
	t.Helper()
	var out []T
	for _, o := range objs {
		if o.Kind == kind {
			out = append(out, o.Obj.(T))
		}
	}
	return out
}

func one[T runtime.Object](t *testing.T, objs []object, kind string) T {
	t.Helper()
	all := find[T](t, objs, kind)
	if len(all) != 1 {
		t.Fatalf("%d objects of kind %s; want 1", len(all), kind)
	}
	return all[0]
}

// checkTether lays out the volumes the Deployment mounts (the ConfigMap's tether.yaml, the token
// Secret's files, the Redis password file) in a temporary directory as the pod sees them, and
// runs `tether validate` on it. A Secret the manifests do not carry (an existingSecret) gets a
// placeholder file.
func checkTether(t *testing.T, objs []object) *tetherConfig {
	t.Helper()
	dep := one[*appsv1.Deployment](t, objs, "Deployment")
	pod := dep.Spec.Template.Spec
	c := pod.Containers[0]
	if len(c.Args) != 3 || c.Args[0] != "serve" || c.Args[1] != "-c" {
		t.Fatalf("container args %v; want serve -c FILE", c.Args)
	}
	cfgPath := c.Args[2]
	dir := t.TempDir()
	cms := map[string]*corev1.ConfigMap{}
	for _, cm := range find[*corev1.ConfigMap](t, objs, "ConfigMap") {
		cms[cm.Name] = cm
	}
	secrets := map[string]*corev1.Secret{}
	for _, s := range find[*corev1.Secret](t, objs, "Secret") {
		secrets[s.Name] = s
	}
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		vols[v.Name] = v
	}
	for _, m := range c.VolumeMounts {
		v, ok := vols[m.Name]
		if !ok {
			t.Fatalf("volume mount %s has no volume", m.Name)
		}
		into := filepath.Join(dir, m.MountPath)
		if err := os.MkdirAll(into, 0o700); err != nil {
			t.Fatal(err)
		}
		files := map[string][]byte{}
		switch {
		case v.ConfigMap != nil:
			cm, ok := cms[v.ConfigMap.Name]
			if !ok {
				t.Fatalf("volume %s: no ConfigMap %s among the manifests", v.Name, v.ConfigMap.Name)
			}
			for k, val := range cm.Data {
				files[k] = []byte(val)
			}
		case v.Secret != nil:
			if s, ok := secrets[v.Secret.SecretName]; ok {
				for k, val := range s.Data {
					files[k] = val
				}
				for k, val := range s.StringData {
					files[k] = []byte(val)
				}
			} else {
				// A Secret the user creates: its keys as the pod would see them.
				for _, it := range v.Secret.Items {
					files[it.Key] = []byte("placeholder-" + it.Key)
				}
				switch {
				case len(v.Secret.Items) > 0:
				case v.Name == "tls":
					files["tls.crt"], files["tls.key"] = selfSigned(t)
					files["ca.crt"] = files["tls.crt"]
				default:
					for _, tok := range tokenNames(t, cms) {
						files[tok] = []byte("placeholder-token")
					}
				}
			}
			for _, it := range v.Secret.Items {
				files[it.Path] = files[it.Key]
				delete(files, it.Key)
			}
		}
		for k, val := range files {
			if err := os.WriteFile(filepath.Join(into, k), val, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	path := filepath.Join(dir, cfgPath)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the container's config %s is not in a mounted volume: %v", cfgPath, err)
	}
	var cfg tetherConfig
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatalf("%s: %v", cfgPath, err)
	}
	validateTether(t, path)
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatalf("%s: %v", cfgPath, err)
	}
	cfg.moveAway = bootstrapMoveAway(t, path)
	return &cfg
}

// tokenNames lists the token names of the config (for placeholder token files).
func tokenNames(t *testing.T, cms map[string]*corev1.ConfigMap) []string {
	t.Helper()
	var names []string
	for _, cm := range cms {
		var c struct {
			Auth struct {
				Tokens []struct {
					Name string `json:"name"`
				} `json:"tokens"`
			} `json:"auth"`
		}
		if err := yaml.Unmarshal([]byte(cm.Data["tether.yaml"]), &c); err != nil {
			t.Fatal(err)
		}
		for _, tk := range c.Auth.Tokens {
			names = append(names, tk.Name)
		}
	}
	slices.Sort(names)
	return names
}

// selfSigned returns a fresh self-signed ECDSA certificate and key in PEM.
func selfSigned(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tether.tether.svc"},
		DNSNames: []string{"tether.tether.svc"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, IsCA: true, BasicConstraintsValid: true,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
}
