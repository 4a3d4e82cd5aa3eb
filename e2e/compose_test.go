package e2e

import (
	"os"
	"slices"
	"strings"
	"testing"
	"weida.dev/connector/cmd/drivers"
	"weida.dev/connector/service"

	"github.com/goccy/go-yaml"

	"weida.dev/connector/policy"
	"weida.dev/connector/resources"
)

type composeFile struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		Build       any               `yaml:"build"`
		NetworkMode string            `yaml:"network_mode"`
		Command     []string          `yaml:"command"`
		Environment map[string]string `yaml:"environment"`
		Volumes     []string          `yaml:"volumes"`
		Healthcheck struct {
			Test []string `yaml:"test"`
		} `yaml:"healthcheck"`
		DependsOn map[string]struct {
			Condition string `yaml:"condition"`
		} `yaml:"depends_on"`
	} `yaml:"services"`
}

// TestComposeMatchesExamples checks, without a Docker engine, that
// docker-compose.yml runs the examples as they are written: the brokers
// listen where the examples look for them, the connector mounts examples/
// and has every environment variable they read, and each service has a
// health check.
func TestComposeMatchesExamples(t *testing.T) {
	raw, err := os.ReadFile("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var cf composeFile
	if err := yaml.Unmarshal(raw, &cf); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	set, err := resources.Load(service.Protocols(drivers.All()), "../examples")
	if err != nil {
		t.Fatalf("examples/ must be valid: %v", err)
	}
	brokerService := map[policy.Protocol]string{policy.MQTT: "mosquitto", policy.NATS: "nats", policy.AMQP: "rabbitmq"}
	for _, name := range []string{"mosquitto", "nats", "rabbitmq", "connector"} {
		s, ok := cf.Services[name]
		if !ok {
			t.Fatalf("docker-compose.yml has no service %q", name)
		}
		if len(s.Healthcheck.Test) == 0 {
			t.Errorf("service %s has no health check", name)
		}
		// The examples address brokers and endpoints at 127.0.0.1.
		if s.NetworkMode != "host" {
			t.Errorf("service %s: network_mode %q, want host (the examples use 127.0.0.1)", name, s.NetworkMode)
		}
	}
	brokerPort := func(service string) string {
		s := cf.Services[service]
		if p, ok := s.Environment["RABBITMQ_NODE_PORT"]; ok {
			return p
		}
		if i := slices.Index(s.Command, "-p"); i >= 0 && i+1 < len(s.Command) {
			return s.Command[i+1]
		}
		return ""
	}
	conn := cf.Services["connector"]
	envs := map[string]bool{}
	listens := map[string]string{}
	for _, c := range set.Connectors() {
		svc := brokerService[c.Protocol]
		if got, want := brokerPort(svc), c.Broker.Addr()[strings.LastIndexByte(c.Broker.Addr(), ':')+1:]; got != want {
			t.Errorf("%s reaches %s at port %s, but service %s listens on %q", c.Name, c.Protocol, want, svc, got)
		}
		if _, ok := conn.DependsOn[svc]; !ok {
			t.Errorf("connector does not wait for %s, which %s needs", svc, c.Name)
		}
		for _, ref := range c.Broker.Credentials.Secrets {
			if ref.Env != "" {
				envs[ref.Env] = true
			}
		}
		if c.Direction == policy.Inbound {
			hp := c.Weida.Endpoint.HostPort()
			if other, dup := listens[hp+c.Weida.Endpoint.Path]; dup {
				t.Errorf("%s and %s host the same endpoint", c.Name, other)
			}
			listens[hp+c.Weida.Endpoint.Path] = c.Name
		}
	}
	for env := range envs {
		if _, ok := conn.Environment[env]; !ok {
			t.Errorf("the examples read $%s, which the connector service does not set", env)
		}
	}
	if !slices.ContainsFunc(conn.Volumes, func(v string) bool { return strings.HasPrefix(v, "./examples:/etc/connector") }) {
		t.Errorf("connector does not mount ./examples at /etc/connector: %v", conn.Volumes)
	}
	if i := slices.Index(conn.Command, "-f"); i < 0 || conn.Command[i+1] != "/etc/connector" {
		t.Errorf("connector command %v does not run -f /etc/connector", conn.Command)
	}
	if i := slices.Index(conn.Command, "--admin"); i < 0 || !strings.Contains(strings.Join(conn.Healthcheck.Test, " "), "http://"+conn.Command[i+1]+"/readyz") {
		t.Errorf("connector health check %v does not probe the --admin listener's /readyz", conn.Healthcheck.Test)
	}
	if conn.Build == nil {
		t.Error("connector is not built from the Dockerfile")
	}
	df, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(df), "./cmd/connector") {
		t.Error("Dockerfile does not build ./cmd/connector")
	}
	// The identities of the generated endpoints live in run's default
	// state directory: the image makes it writable for its user and a
	// volume, and compose keeps it across rebuilds.
	if !strings.Contains(string(df), "VOLUME /var/lib/weida-connector") || !strings.Contains(string(df), "chown connector:connector /var/lib/weida-connector") {
		t.Error("Dockerfile does not create /var/lib/weida-connector for its user and declare it a volume")
	}
	if !slices.ContainsFunc(conn.Volumes, func(v string) bool { return strings.HasSuffix(v, ":/var/lib/weida-connector") }) {
		t.Errorf("connector does not keep /var/lib/weida-connector on a volume: %v", conn.Volumes)
	}
}
