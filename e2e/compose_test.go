package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
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
		Ports       []string          `yaml:"ports"`
		Healthcheck struct {
			Test []string `yaml:"test"`
		} `yaml:"healthcheck"`
		DependsOn map[string]struct {
			Condition string `yaml:"condition"`
		} `yaml:"depends_on"`
	} `yaml:"services"`
}

// TestComposeMatchesExamples checks, without a Docker engine, that
// docker-compose.yml runs the examples as they are written: the services
// share the pod's network namespace, so that 127.0.0.1 means the same in
// each, the brokers listen where the examples look for them, the host sees
// them only on its loopback, the connector mounts examples/ and has every
// environment variable they read, every image can be replaced by a
// variable, and each service has a health check. TestComposeStack runs
// the file for real.
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
		if s.NetworkMode != "service:pod" {
			t.Errorf("service %s: network_mode %q, want service:pod (the examples use 127.0.0.1)", name, s.NetworkMode)
		}
	}
	for name, s := range cf.Services {
		if !composeImageVar.MatchString(s.Image) {
			t.Errorf("service %s: image %q is not ${NAME_IMAGE:-default}: where no registry is reachable it cannot be replaced", name, s.Image)
		}
	}
	published := map[string]bool{}
	for _, p := range cf.Services["pod"].Ports {
		cut := strings.LastIndexByte(p, ':')
		host, container := strings.TrimPrefix(p[:max(cut, 0)], "127.0.0.1:"), p[cut+1:]
		if !strings.HasPrefix(p, "127.0.0.1:") || !strings.HasPrefix(host, "${") || !strings.HasSuffix(host, "}") {
			t.Errorf("pod publishes %q; want 127.0.0.1:${VAR:-port}:port, on the host's loopback at a port one can move", p)
		}
		published[container] = true
	}
	brokerPort := func(service string) string {
		s := cf.Services[service]
		if p, ok := s.Environment["RABBITMQ_NODE_PORT"]; ok {
			return p
		}
		if i := slices.Index(s.Command, "-p"); i >= 0 && i+1 < len(s.Command) {
			return s.Command[i+1]
		}
		if i := slices.Index(s.Command, "-c"); i >= 0 && i+1 < len(s.Command) {
			return mosquittoListener(t, s.Volumes, s.Command[i+1])
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
		if port := brokerPort(svc); !published[port] {
			t.Errorf("service %s listens on %q, which the pod does not publish", svc, port)
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
	// connector health asks /readyz of the listener --admin names.
	if i := slices.Index(conn.Command, "--admin"); i < 0 || !slices.Equal(conn.Healthcheck.Test, []string{"CMD", "connector", "health", "--admin", conn.Command[i+1]}) {
		t.Errorf("connector health check %v does not probe the --admin listener's /readyz", conn.Healthcheck.Test)
	} else if _, port, _ := strings.Cut(conn.Command[i+1], ":"); !published[port] {
		t.Errorf("the pod does not publish the admin listener's port %s", port)
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
	// Where no registry is reachable, scripts/compose-test passes images
	// of its own and builds the runtime target on them.
	for _, want := range []string{"ARG GO_IMAGE=golang:", "ARG RUNTIME_IMAGE=alpine:", "FROM ${GO_IMAGE} AS build", "FROM ${RUNTIME_IMAGE} AS runtime",
		"EXPOSE 9090/tcp", "org.opencontainers.image.title=", "org.opencontainers.image.version=", `CMD ["connector", "health"`} {
		if !strings.Contains(string(df), want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
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

// TestComposeStack drives the stack that scripts/compose-test brings up
// from docker-compose.yml with a real Docker engine, as a user of the
// compose file would: every example resource is Ready in /status, and a
// reading published to the stack's Mosquitto crosses the MQTT bridge onto
// its weida endpoint and from there reaches the stack's nats-server and
// RabbitMQ through the outbound examples. The brokers are reached through
// the ports compose publishes on the host's loopback; the weida endpoint
// listens inside the stack, so its subscriber runs there (docker exec).
func TestComposeStack(t *testing.T) {
	admin := os.Getenv("WEIDA_COMPOSE_ADMIN")
	if admin == "" {
		t.Skip("needs the running compose stack: scripts/compose-test builds it with a Docker engine and runs this test")
	}
	mqttAddr, natsAddr, amqpAddr := os.Getenv("WEIDA_COMPOSE_MQTT"), os.Getenv("WEIDA_COMPOSE_NATS"), os.Getenv("WEIDA_COMPOSE_AMQP")
	container := os.Getenv("WEIDA_COMPOSE_CONNECTOR")
	stack := &Connector{t: t, Admin: admin}

	set, err := resources.Load(service.Protocols(drivers.All()), "../examples")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range set.Connectors() {
		names = append(names, c.Name)
	}
	if len(names) == 0 {
		t.Fatal("examples/ names no resources")
	}
	waitReady := time.Now().Add(30 * time.Second)
	for _, name := range names {
		for {
			st, ok := stack.Status(name)
			if ok && st.ready() {
				break
			}
			if time.Now().After(waitReady) {
				t.Fatalf("%s is not Ready in the stack's /status:\n%s", name, stack.StatusJSON())
			}
			time.Sleep(200 * time.Millisecond)
		}
	}

	// examples/: mqtt-sensors-in bridges sensors/+/temperature and
	// factory/# onto weida://127.0.0.1:7001/sensors; nats-sensors-out and
	// amqp-factory-out read that endpoint and publish on.
	u := unique()
	sensorTopic, factoryTopic := "sensors/"+u+"/temperature", "factory/"+u+"/line"
	fromNATS := collectNATS(t, natsConn(t, natsAddr), "sensors."+u+".temperature")
	fromAMQP := amqpCollect(t, amqpAddr, "amq.topic", "factory."+u+".#")

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The fingerprint is examples/certs/endpoint.crt's, which
	// mqtt-inbound.yaml's endpoint presents.
	sub := exec.CommandContext(ctx, "docker", "exec", container, "connector", "weida", "sub",
		"weida://sha256:9091e5f37dc3e870fcce55bf2721bd5db9e7ba9067b3b8067fd12f0153a52b98@127.0.0.1:7001/sensors",
		"--filter", "sensors."+u+".temperature", "--count", "1", "--output", "json")
	var subOut, subErr strings.Builder
	sub.Stdout, sub.Stderr = &subOut, &subErr
	if err := sub.Start(); err != nil {
		t.Fatalf("docker exec %s connector weida sub: %v", container, err)
	}
	subDone := make(chan error, 1)
	go func() { subDone <- sub.Wait() }()

	// Subscriptions settle at their own pace across three hops; publish
	// until each end has had a reading, then check what it got.
	pub := mqttConnect(t, mqttAddr, "compose-"+u)
	var subExit error
	weidaGot := false
	for i := 0; fromNATS.Len() == 0 || fromAMQP.Len() == 0 || !weidaGot; i++ {
		if ctx.Err() != nil {
			t.Fatalf("after %d rounds: NATS got %d, AMQP got %d, weida subscriber done %v (%v; stderr %q)\n/status:\n%s",
				i, fromNATS.Len(), fromAMQP.Len(), weidaGot, subExit, subErr.String(), stack.StatusJSON())
		}
		pub.publish(t, 1, sensorTopic, fmt.Sprintf("21.%d", i))
		pub.publish(t, 1, factoryTopic, fmt.Sprintf("line-%d", i))
		select {
		case subExit = <-subDone:
			weidaGot = subExit == nil
			if !weidaGot {
				t.Fatalf("the weida subscriber in the connector container failed: %v; stderr %q", subExit, subErr.String())
			}
		case <-time.After(250 * time.Millisecond):
		}
	}

	var got struct{ Topic, Payload string }
	if err := json.Unmarshal([]byte(subOut.String()), &got); err != nil || got.Topic != "sensors."+u+".temperature" || !strings.HasPrefix(got.Payload, "21.") {
		t.Errorf("weida subscriber printed %q (%v); want a reading on sensors.%s.temperature", subOut.String(), err, u)
	}
	if m := fromNATS.Messages()[0]; m.Subject != "sensors."+u+".temperature" || !strings.HasPrefix(string(m.Data), "21.") {
		t.Errorf("NATS got %s %q; want a reading on sensors.%s.temperature", m.Subject, m.Data, u)
	}
	if d := fromAMQP.Messages()[0]; d.RoutingKey != "factory."+u+".line" || !strings.HasPrefix(string(d.Body), "line-") {
		t.Errorf("AMQP got %s %q; want a reading routed factory.%s.line", d.RoutingKey, d.Body, u)
	}
	for _, name := range []string{"mqtt-sensors-in", "nats-sensors-out", "amqp-factory-out"} {
		st, ok := stack.Status(name)
		if !ok || st.Counters.Bridged == 0 {
			t.Errorf("/status counts nothing bridged by %s:\n%s", name, stack.StatusJSON())
		}
	}
}

// composeImageVar is an image the environment can replace, with the public
// image as the default: ${MOSQUITTO_IMAGE:-eclipse-mosquitto:2}.
var composeImageVar = regexp.MustCompile(`^\$\{[A-Z]+_IMAGE:-[^}]+\}$`)

// mosquittoListener is the port of the listener line in the Mosquitto
// configuration file the service mounts at path.
func mosquittoListener(t *testing.T, volumes []string, path string) string {
	t.Helper()
	for _, v := range volumes {
		src, rest, _ := strings.Cut(v, ":")
		if dst, _, _ := strings.Cut(rest, ":"); dst == path {
			raw, err := os.ReadFile(filepath.Join("..", src))
			if err != nil {
				t.Fatal(err)
			}
			for _, line := range strings.Split(string(raw), "\n") {
				if f := strings.Fields(line); len(f) >= 2 && f[0] == "listener" {
					return f[1]
				}
			}
			t.Fatalf("%s has no listener line", src)
		}
	}
	t.Fatalf("no volume mounts %s", path)
	return ""
}
