package config

import (
	"net/url"
	"os"
	"strings"
	"time"
)

// Autoscaling configures the scale events tether emits for an autoscaler (besides the
// tether_service_desired_instances gauge on /metrics):
//
//	field                                 default                              allowed
//	autoscaling.scaleInAfter              5m                                   1s..24h
//	autoscaling.webhook.url               "" (no webhook)                      http(s) URL
//	autoscaling.webhook.secret / secretFile  (exactly one with a url)          non-empty
//	autoscaling.webhook.timeout           10s                                  100ms..1m
//	autoscaling.webhook.maxAttempts       6                                    1..20
//
// A scale-out event is sent when a new session opens a standby instance (every active one
// being full); a scale-in event when an instance that held sessions has been empty for
// scaleInAfter. Deliveries are POSTs of JSON signed with HMAC-SHA256 (see pkg/status).
type Autoscaling struct {
	// ScaleInAfter is how long an instance that held sessions must stay empty before a
	// scale-in event names it.
	ScaleInAfter time.Duration `yaml:"scaleInAfter"`
	// Webhook receives the events.
	Webhook Webhook `yaml:"webhook"`
}

// Webhook is where scale events are delivered.
type Webhook struct {
	// URL receives a POST per event; "" turns the webhook off.
	URL string `yaml:"url"`
	// Secret signs each delivery. After Parse it is set even when SecretFile names the file
	// (its content, trimmed of surrounding white space).
	Secret string `yaml:"secret"`
	// SecretFile is the file the secret is read from (resolved against the config file's
	// directory), or "".
	SecretFile string `yaml:"secretFile"`
	// Timeout bounds one delivery attempt.
	Timeout time.Duration `yaml:"timeout"`
	// MaxAttempts is how many times one event is tried (backoff 1s, doubling, at most 30s).
	MaxAttempts int `yaml:"maxAttempts"`
}

func (a *Autoscaling) setDefaults() {
	*a = Autoscaling{ScaleInAfter: 5 * time.Minute, Webhook: Webhook{Timeout: 10 * time.Second, MaxAttempts: 6}}
}

func (v *validator) autoscaling() {
	a := &v.cfg.Autoscaling
	v.durRange("autoscaling.scaleInAfter", a.ScaleInAfter, time.Second, 24*time.Hour)
	w := &a.Webhook
	v.durRange("autoscaling.webhook.timeout", w.Timeout, 100*time.Millisecond, time.Minute)
	v.intRange("autoscaling.webhook.maxAttempts", w.MaxAttempts, 1, 20)
	if w.URL == "" {
		if w.Secret != "" || w.SecretFile != "" {
			v.errorf("autoscaling.webhook.url", "required with a secret")
		}
		return
	}
	if u, err := url.Parse(w.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		v.errorf("autoscaling.webhook.url", "%q is not an http(s) URL", w.URL)
	}
	switch {
	case w.Secret != "" && w.SecretFile != "":
		v.errorf("autoscaling.webhook.secret", "set secret or secretFile, not both")
	case w.SecretFile != "":
		w.SecretFile = v.resolve(w.SecretFile)
		data, err := os.ReadFile(w.SecretFile)
		switch {
		case err != nil:
			v.errorf("autoscaling.webhook.secretFile", "%v", err)
		case strings.TrimSpace(string(data)) == "":
			v.errorf("autoscaling.webhook.secretFile", "%s is empty", w.SecretFile)
		default:
			w.Secret = strings.TrimSpace(string(data))
		}
	case w.Secret == "":
		v.errorf("autoscaling.webhook.secret", "required with a url (or secretFile): deliveries are signed")
	}
}
