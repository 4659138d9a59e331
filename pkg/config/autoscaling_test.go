package config_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tether-dev/tether/pkg/config"
)

func TestAutoscalingWebhook(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "hook.secret"), []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := "apiVersion: tether/v1\nservices:\n- name: web\n  instances:\n  - {id: a, address: 10.0.0.1, ports: {http: 8081}}\n"
	for _, tc := range []struct {
		name, yaml, wantErr string
		secret              string
	}{
		{name: "off by default", yaml: ""},
		{name: "secret file", yaml: "autoscaling:\n  scaleInAfter: 2m\n  webhook: {url: 'http://127.0.0.1:1/hook', secretFile: hook.secret}\n", secret: "s3cret"},
		{name: "unsigned refused", yaml: "autoscaling:\n  webhook: {url: 'http://127.0.0.1:1/hook'}\n", wantErr: "autoscaling.webhook.secret: required"},
		{name: "bad url", yaml: "autoscaling:\n  webhook: {url: 'ftp://x', secret: s}\n", wantErr: "autoscaling.webhook.url"},
		{name: "both secrets", yaml: "autoscaling:\n  webhook: {url: 'http://h/x', secret: s, secretFile: hook.secret}\n", wantErr: "not both"},
		{name: "scale-in too short", yaml: "autoscaling:\n  scaleInAfter: 10ms\n", wantErr: "autoscaling.scaleInAfter"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := config.Parse([]byte(base+tc.yaml), filepath.Join(dir, "tether.yaml"))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Autoscaling.Webhook.Secret != tc.secret {
				t.Errorf("secret = %q, want %q", c.Autoscaling.Webhook.Secret, tc.secret)
			}
		})
	}
}
