package fleet

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/tether-dev/tether/pkg/registry"
)

// Kinds of facts, the first part of a field name.
const (
	kindInstance = "i"
	kindState    = "s"
	kindHealth   = "h"
	sep          = "\x1f" // unit separator: in no service name or instance id
)

func field(kind string, k registry.Key) string { return kind + sep + k.Service + sep + k.ID }

// wireInstance is a registration as stored (JSON). Health is not part of it: verdicts are
// facts of their own.
type wireInstance struct {
	Address  string `json:"address"`
	HTTPPort int    `json:"httpPort,omitempty"`
	SIPPort  int    `json:"sipPort,omitempty"`
	Weight   uint32 `json:"weight,omitempty"`
	Zone     string `json:"zone,omitempty"`
	State    string `json:"state,omitempty"`
}

type wireState struct {
	Declared string `json:"declared"`
	Set      string `json:"set"`
}

func toWire(in registry.Instance) wireInstance {
	return wireInstance{Address: in.Address, HTTPPort: in.HTTPPort, SIPPort: in.SIPPort,
		Weight: in.Weight, Zone: in.Zone, State: string(in.State)}
}

type badField struct {
	field string
	err   error
}

// decodeLayer turns the admin hash into a registry.AdminLayer. Malformed fields are skipped
// and returned, so one bad entry never hides the rest.
func decodeLayer(fields map[string]string) (registry.AdminLayer, []badField) {
	l := registry.AdminLayer{States: map[registry.Key]registry.StateOverride{}, Health: map[registry.Key]registry.Health{}}
	var bad []badField
	for f, v := range fields {
		if err := decodeField(&l, f, v); err != nil {
			bad = append(bad, badField{f, err})
		}
	}
	return l, bad
}

func decodeField(l *registry.AdminLayer, f, v string) error {
	parts := strings.Split(f, sep)
	if len(parts) != 3 || parts[1] == "" || parts[2] == "" {
		return errors.New("not kind, service and id")
	}
	k := registry.Key{Service: parts[1], ID: parts[2]}
	switch parts[0] {
	case kindInstance:
		var w wireInstance
		if err := json.Unmarshal([]byte(v), &w); err != nil {
			return err
		}
		if w.Address == "" || w.HTTPPort <= 0 && w.SIPPort <= 0 {
			return errors.New("registration without an address and a port")
		}
		l.Instances = append(l.Instances, registry.Instance{Service: k.Service, ID: k.ID, Address: w.Address,
			HTTPPort: w.HTTPPort, SIPPort: w.SIPPort, Weight: w.Weight, Zone: w.Zone, State: registry.State(w.State)})
	case kindState:
		var w wireState
		if err := json.Unmarshal([]byte(v), &w); err != nil {
			return err
		}
		if !validState(w.Set) {
			return fmt.Errorf("state %q", w.Set)
		}
		l.States[k] = registry.StateOverride{Declared: registry.State(w.Declared), Set: registry.State(w.Set)}
	case kindHealth:
		switch h := registry.Health(v); h {
		case registry.HealthHealthy, registry.HealthUnhealthy:
			l.Health[k] = h
		default:
			return fmt.Errorf("health %q", v)
		}
	default:
		return fmt.Errorf("kind %q", parts[0])
	}
	return nil
}

func validState(s string) bool {
	switch registry.State(s) {
	case registry.StateActive, registry.StateStandby, registry.StateDraining:
		return true
	}
	return false
}
