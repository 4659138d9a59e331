package deploytest

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	"sigs.k8s.io/yaml"
)

var composeDir = filepath.Join(root, "examples/compose")

// loadCompose loads compose files (later ones override earlier ones, as `docker compose -f a
// -f b` does) with the compose-spec Go loader, which checks them against the compose schema.
func loadCompose(t *testing.T, files ...string) *types.Project {
	t.Helper()
	dir, err := filepath.Abs(composeDir)
	if err != nil {
		t.Fatal(err)
	}
	var cfs []types.ConfigFile
	for _, f := range files {
		cfs = append(cfs, types.ConfigFile{Filename: filepath.Join(dir, f)})
	}
	p, err := loader.LoadWithContext(context.Background(), types.ConfigDetails{WorkingDir: dir, ConfigFiles: cfs, Environment: types.Mapping{}},
		func(o *loader.Options) { o.SetProjectName("tether-example", true) })
	if err != nil {
		t.Fatalf("compose %v: %v", files, err)
	}
	return p
}

// composeTether is what the compose checks read from a mounted tether config.
type composeTether struct {
	Listeners struct {
		ExtProc string `json:"extProc"`
		XDS     string `json:"xds"`
	} `json:"listeners"`
	Envoy struct {
		ListenerAddress string `json:"listenerAddress"`
		Replicas        []struct {
			XDS     string `json:"xds"`
			ExtProc string `json:"extProc"`
		} `json:"replicas"`
	} `json:"envoy"`
	Store struct {
		Redis struct {
			Addresses []string `json:"addresses"`
		} `json:"redis"`
	} `json:"store"`
	Services []struct {
		Instances []struct {
			ID      string `json:"id"`
			Address string `json:"address"`
			Ports   struct {
				HTTP int `json:"http"`
			} `json:"ports"`
		} `json:"instances"`
	} `json:"services"`
}

// TestCompose loads examples/compose (and its HA override) with the compose-spec loader and
// checks that the pieces fit: the official Envoy image at 1.38 or later; tether hardened
// (read-only root, non-root user, no capabilities); every bind mount exists; the instance,
// replica and Redis addresses in the mounted tether config are the compose network's fixed
// addresses of those containers; the mounted Envoy bootstrap is the one generated from the
// mounted tether config (examples/compose's own test checks it byte for byte and validates
// both). Docker is not available here, so nothing is started.
func TestCompose(t *testing.T) {
	for _, c := range []struct {
		name    string
		files   []string
		tethers []string
		redis   bool
	}{
		{"single", []string{"compose.yaml"}, []string{"tether"}, false},
		{"ha", []string{"compose.yaml", "compose.ha.yaml"}, []string{"tether", "tether-2"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := loadCompose(t, c.files...)
			ip := map[string]string{}
			mounts := map[string]map[string]string{} // service → target → source
			for name, s := range p.Services {
				for _, n := range s.Networks {
					if n != nil && n.Ipv4Address != "" {
						ip[name] = n.Ipv4Address
					}
				}
				mounts[name] = map[string]string{}
				for _, v := range s.Volumes {
					if v.Type == types.VolumeTypeBind {
						if _, err := os.Stat(v.Source); err != nil {
							t.Errorf("%s mounts %s: %v", name, v.Source, err)
						}
						if !v.ReadOnly {
							t.Errorf("%s mounts %s writable", name, v.Source)
						}
						mounts[name][v.Target] = v.Source
					}
				}
			}

			envoy, ok := p.Services["envoy"]
			if !ok {
				t.Fatal("no envoy service")
			}
			m := regexp.MustCompile(`^envoyproxy/envoy:v1\.(\d+)`).FindStringSubmatch(envoy.Image)
			if len(m) < 2 || atoi(m[1]) < 38 {
				t.Errorf("envoy image %q; want the official envoyproxy/envoy at v1.38 or later", envoy.Image)
			}

			var cfg composeTether
			cfgSource := ""
			for _, name := range c.tethers {
				s, ok := p.Services[name]
				if !ok {
					t.Fatalf("no %s service", name)
				}
				if !s.ReadOnly || !slices.Contains(s.CapDrop, "ALL") || s.User == "" || strings.HasPrefix(s.User, "0") || strings.HasPrefix(s.User, "root") {
					t.Errorf("%s: read_only %v, cap_drop %v, user %q; want a read-only, capability-free, non-root container", name, s.ReadOnly, s.CapDrop, s.User)
				}
				src := mounts[name]["/etc/tether/tether.yaml"]
				if src == "" {
					t.Fatalf("%s mounts no /etc/tether/tether.yaml", name)
				}
				if cfgSource != "" && src != cfgSource {
					t.Errorf("replicas read different configs: %s and %s", cfgSource, src)
				}
				cfgSource = src
			}
			data, err := os.ReadFile(cfgSource)
			if err != nil {
				t.Fatal(err)
			}
			if err := yaml.Unmarshal(data, &cfg); err != nil {
				t.Fatal(err)
			}
			for _, svc := range cfg.Services {
				for _, in := range svc.Instances {
					if ip[in.ID] != in.Address {
						t.Errorf("instance %s at %s in %s; the compose service %s has %q", in.ID, in.Address, filepath.Base(cfgSource), in.ID, ip[in.ID])
					}
				}
			}
			if len(cfg.Envoy.Replicas) != len(c.tethers) {
				t.Errorf("envoy.replicas lists %d tethers; compose runs %d", len(cfg.Envoy.Replicas), len(c.tethers))
			}
			for i, r := range cfg.Envoy.Replicas {
				h, _, _ := net.SplitHostPort(r.XDS)
				if i < len(c.tethers) && ip[c.tethers[i]] != h {
					t.Errorf("envoy.replicas[%d] at %s; %s is at %s", i, h, c.tethers[i], ip[c.tethers[i]])
				}
			}
			if c.redis {
				var h string
				if len(cfg.Store.Redis.Addresses) == 1 {
					h, _, _ = net.SplitHostPort(cfg.Store.Redis.Addresses[0])
				}
				if _, ok := p.Services["redis"]; !ok || ip["redis"] != h {
					t.Errorf("store.redis.addresses %q; the redis service is at %q", cfg.Store.Redis.Addresses, ip["redis"])
				}
			}
			envoySrc := mounts["envoy"]["/etc/envoy/envoy.yaml"]
			want := strings.Replace(filepath.Base(cfgSource), "tether", "envoy", 1)
			if filepath.Base(envoySrc) != want {
				t.Errorf("envoy mounts %s; want %s, the bootstrap of %s", envoySrc, want, filepath.Base(cfgSource))
			}
		})
	}
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }
