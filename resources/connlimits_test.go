package resources_test

import (
	"slices"
	"testing"
	"time"
)

// TestConnectionLimits: spec.weida.maxConnections and
// maxConnectionsPerAddress reach the resource, zero when left out (weida's
// defaults), and are refused out of range, above one another, or on an
// outbound resource (issue 25).
func TestConnectionLimits(t *testing.T) {
	set, err := loadFiles(t, "a.yaml", edit(t, mqttIn, "/sensors\n", "/sensors\n    maxConnections: 4096\n    maxConnectionsPerAddress: 16\n"))
	if err != nil {
		t.Fatal(err)
	}
	if w := set.Connectors()[0].Weida; w.MaxConnections != 4096 || w.MaxConnectionsPerAddress != 16 {
		t.Errorf("limits %d, %d; want 4096, 16", w.MaxConnections, w.MaxConnectionsPerAddress)
	}
	set, err = loadFiles(t, "a.yaml", mqttIn)
	if err != nil {
		t.Fatal(err)
	}
	if w := set.Connectors()[0].Weida; w.MaxConnections != 0 || w.MaxConnectionsPerAddress != 0 {
		t.Errorf("limits %d, %d left out; want 0, 0 (weida's defaults)", w.MaxConnections, w.MaxConnectionsPerAddress)
	}
	for _, c := range []struct {
		name, doc string
		want      []string
	}{
		{"zero", edit(t, mqttIn, "/sensors\n", "/sensors\n    maxConnections: 0\n"), []string{"spec.weida.maxConnections min"}},
		{"too many", edit(t, mqttIn, "/sensors\n", "/sensors\n    maxConnectionsPerAddress: 100000\n"), []string{"spec.weida.maxConnectionsPerAddress max"}},
		{"above the default", edit(t, mqttIn, "/sensors\n", "/sensors\n    maxConnectionsPerAddress: 2000\n"), []string{"spec.weida.maxConnectionsPerAddress weida-connections"}},
		{"above maxConnections", edit(t, mqttIn, "/sensors\n", "/sensors\n    maxConnections: 10\n    maxConnectionsPerAddress: 11\n"), []string{"spec.weida.maxConnectionsPerAddress weida-connections"}},
		{"raised together", edit(t, mqttIn, "/sensors\n", "/sensors\n    maxConnections: 4096\n    maxConnectionsPerAddress: 2000\n"), nil},
		{"outbound", edit(t, mqttOut, "/orders\n", "/orders\n    maxConnections: 10\n"), []string{"spec.weida.maxConnections direction-field"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := loadDiags(t, c.doc); !slices.Equal(got, c.want) {
				t.Errorf("diagnostics %q, want %q", got, c.want)
			}
		})
	}
}

// TestIdleTimeout: spec.weida.idleTimeout reaches the resource, zero when
// left out (weida's 2 s for a listener), and is refused outside 1s to 1m
// or on an outbound resource (issue 21: subscribers that read lost their
// connections to the 2 s timeout on a saturated endpoint).
func TestIdleTimeout(t *testing.T) {
	set, err := loadFiles(t, "a.yaml", edit(t, mqttIn, "/sensors\n", "/sensors\n    idleTimeout: 10s\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := set.Connectors()[0].Weida.IdleTimeout; got != 10*time.Second {
		t.Errorf("idleTimeout %v, want 10s", got)
	}
	set, err = loadFiles(t, "a.yaml", mqttIn)
	if err != nil {
		t.Fatal(err)
	}
	if got := set.Connectors()[0].Weida.IdleTimeout; got != 0 {
		t.Errorf("idleTimeout %v left out, want 0 (weida's default)", got)
	}
	for _, c := range []struct {
		name, doc string
		want      []string
	}{
		{"shortest", edit(t, mqttIn, "/sensors\n", "/sensors\n    idleTimeout: 1s\n"), nil},
		{"longest", edit(t, mqttIn, "/sensors\n", "/sensors\n    idleTimeout: 1m\n"), nil},
		{"too short", edit(t, mqttIn, "/sensors\n", "/sensors\n    idleTimeout: 500ms\n"), []string{"spec.weida.idleTimeout weida-idle-timeout"}},
		{"too long", edit(t, mqttIn, "/sensors\n", "/sensors\n    idleTimeout: 2m\n"), []string{"spec.weida.idleTimeout weida-idle-timeout"}},
		{"outbound", edit(t, mqttOut, "/orders\n", "/orders\n    idleTimeout: 10s\n"), []string{"spec.weida.idleTimeout direction-field"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := loadDiags(t, c.doc); !slices.Equal(got, c.want) {
				t.Errorf("diagnostics %q, want %q", got, c.want)
			}
		})
	}
}
