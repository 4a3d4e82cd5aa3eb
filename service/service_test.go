package service_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"
	driverlist "weida.dev/connector/cmd/drivers"

	"weida.dev/connector/connectors"
	"weida.dev/connector/connectors/nats"
	"weida.dev/connector/policy"
	"weida.dev/connector/resources"
	"weida.dev/connector/service"
)

func drivers() []service.Driver { return driverlist.All() }

// env reads secrets from a map instead of the process environment.
func env(vars map[string]string, ds ...service.Driver) service.Env {
	if ds == nil {
		ds = drivers()
	}
	return service.Env{
		Drivers:    ds,
		Resolver:   resources.Resolver{LookupEnv: func(k string) (string, bool) { v, ok := vars[k]; return v, ok }},
		LoopMarker: "test",
	}
}

func loadExamples(t *testing.T) []*resources.Connector {
	t.Helper()
	set, err := resources.Load(service.Protocols(drivers()), "../examples")
	if err != nil {
		t.Fatalf("examples: %v", err)
	}
	return set.Connectors()
}

func TestUnitsFromExamples(t *testing.T) {
	cs := loadExamples(t)
	units, err := service.Units(cs, env(map[string]string{"AMQP_PASSWORD": "guest"}))
	if err != nil {
		t.Fatal(err)
	}
	if len(units) != len(cs) || len(units) != 7 {
		t.Fatalf("%d units from %d resources, want 7", len(units), len(cs))
	}
	for i, u := range units {
		c := cs[i]
		if u.Revision != c.Revision() || u.Spec.Name != c.Name || u.Spec.Protocol != c.Protocol || u.Spec.Policy != c.Policy || len(u.Spec.Routes) != len(c.Routes) {
			t.Errorf("%s: spec %+v", c.Name, u.Spec)
		}
		if u.Spec.MaxMessageBytes != int(c.Limits.MaxMessageBytes) || u.Spec.InFlight != c.Limits.InFlight {
			t.Errorf("%s: limits %+v", c.Name, u.Spec)
		}
		switch c.Direction {
		case policy.Inbound:
			if u.NewSource == nil || u.NewSink != nil || u.Dial != nil || u.Listen != c.Weida.Endpoint.HostPort() || u.Path != c.Weida.Endpoint.Path {
				t.Errorf("%s: inbound unit %+v", c.Name, u)
			}
		case policy.Outbound:
			if u.NewSink == nil || u.NewSource != nil || u.Dial == nil || u.Listen != "" {
				t.Errorf("%s: outbound unit %+v", c.Name, u)
			}
		}
	}
}

// TestMountedUnitConverts: a mounted resource's unit carries the mounted
// policy, so the runtime, which converts only through Spec.Policy, places
// the broker's subtree under the weida prefix and drops what lies outside.
func TestMountedUnitConverts(t *testing.T) {
	units, cs, err := service.Load([]string{"../examples/mqtt-mounted.yaml"}, env(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(units) != 1 || cs[0].Mount != (policy.Mount{Foreign: "factory/", Weida: "plants.berlin."}) {
		t.Fatalf("units %d, mount %+v", len(units), cs[0].Mount)
	}
	p := units[0].Spec.Policy
	if _, ok := p.(*policy.Mounted); !ok {
		t.Fatalf("Spec.Policy is %T, want *policy.Mounted", p)
	}
	if got, err := p.TopicToWeida("factory/hall-2/press"); err != nil || got != "plants.berlin.hall-2.press" {
		t.Errorf("TopicToWeida(factory/hall-2/press) = %q, %v", got, err)
	}
	var r *policy.Refusal
	if _, err := p.TopicToWeida("office/x"); !errors.As(err, &r) || r.Rule != policy.RuleMountOutside {
		t.Errorf("TopicToWeida(office/x): %v, want %s", err, policy.RuleMountOutside)
	}
	for _, rt := range units[0].Spec.Routes {
		if !strings.HasPrefix(rt.Weida, "plants.berlin.") {
			t.Errorf("route %s: weida filter %q is outside the mount", rt.Name, rt.Weida)
		}
	}
}

// TestRefusedResourceBuildsNothing: a file with an invalid resource gives
// no unit at all, and the error is the diagnostics.
func TestRefusedResourceBuildsNothing(t *testing.T) {
	units, cs, err := service.Load([]string{"../examples/mqtt-inbound.yaml", "../examples/invalid/mqtt-qos2.yaml"}, env(nil), nil)
	var le *service.LoadError
	if !errors.As(err, &le) || units != nil || cs != nil {
		t.Fatalf("Load = %d units, %v", len(units), err)
	}
	if le.Set == nil || !strings.Contains(le.Text, "mqtt-qos-2") {
		t.Errorf("LoadError %q", le.Text)
	}
	_, _, err = service.Load([]string{"../examples/mqtt-inbound.yaml"}, env(nil, nats.Driver), nil)
	if !errors.As(err, &le) || !strings.Contains(le.Text, "spec.protocol") {
		t.Errorf("a protocol without a driver: %v", err)
	}
}

// TestMissingSecretBuildsNothing: all or nothing, naming the reference and
// never a value.
func TestMissingSecretBuildsNothing(t *testing.T) {
	units, err := service.Units(loadExamples(t), env(nil))
	var ue *service.UnitsError
	if !errors.As(err, &ue) || units != nil {
		t.Fatalf("Units = %d, %v", len(units), err)
	}
	if len(ue.Lines) != 2 || !strings.Contains(err.Error(), "AMQP_PASSWORD") || !strings.Contains(err.Error(), `resource "amqp-audit-in"`) {
		t.Errorf("error:\n%v", err)
	}
}

// spy is a driver that records the BrokerConfig it is given.
type spy struct {
	service.Driver
	got *resources.BrokerConfig
}

func (s spy) Source(cfg resources.BrokerConfig) connectors.SourceFactory {
	*s.got = cfg
	return s.Driver.Source(cfg)
}

func (s spy) Sink(cfg resources.BrokerConfig) connectors.SinkFactory {
	*s.got = cfg
	return s.Driver.Sink(cfg)
}

func TestSecretsResolved(t *testing.T) {
	dir := t.TempDir()
	res := `apiVersion: connector.weida.dev/v1alpha1
kind: Connector
metadata: {name: nats-in}
spec:
  protocol: nats
  direction: inbound
  broker:
    url: nats://127.0.0.1:4222
    clientID: bridge-${REPLICA}
    credentials: {token: {file: token}}
  weida: {listen: "weida://127.0.0.1:7999/orders"}
  conversion: {losses: [at-most-once, delivery-best-effort, non-utf8-names, ordering, properties, reply-to, topic-length]}
  routes: [{filter: orders.*}]
`
	if err := os.WriteFile(dir+"/r.yaml", []byte(res), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir+"/token", []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var got resources.BrokerConfig
	e := env(map[string]string{"REPLICA": "2"}, spy{nats.Driver, &got})
	units, cs, err := service.Load([]string{dir + "/r.yaml"}, e, nil)
	if err != nil || len(units) != 1 {
		t.Fatalf("Load: %v", err)
	}
	if got.Credentials.Secret("token").Reveal() != "s3cret" || got.LoopMarker != "test" || got.Logger == nil || got.TLS != nil {
		t.Errorf("broker config %+v", got)
	}
	// The driver sees the expanded client id, the loaded resource keeps
	// the template, and the unit's revision is the expanded configuration
	// (a reload after the variable changed restarts the resource).
	if got.Resource.Broker.ClientID != "bridge-2" || cs[0].Broker.ClientID != "bridge-${REPLICA}" ||
		units[0].Revision != got.Resource.Revision() || units[0].Revision == cs[0].Revision() {
		t.Errorf("client id %q, template %q, revision %q", got.Resource.Broker.ClientID, cs[0].Broker.ClientID, units[0].Revision)
	}
}

func TestRunRefusesBeforeStarting(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var le *service.LoadError
	err := service.Run(ctx, service.Config{Env: env(nil), Paths: []string{"../examples/invalid/extra-loss.yaml"}}, make(chan struct{}))
	if !errors.As(err, &le) {
		t.Errorf("invalid resource: %v", err)
	}

	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	var ae *service.AdminError
	err = service.Run(ctx, service.Config{Env: env(nil), Paths: []string{"../examples/nats-outbound.yaml"}, Admin: busy.Addr().String()}, make(chan struct{}))
	if !errors.As(err, &ae) || ae.Addr != busy.Addr().String() {
		t.Errorf("busy admin address: %v", err)
	}
}

// TestRunReloadsAndStops runs an outbound NATS resource whose weida
// endpoint does not exist (the runtime keeps retrying), reloads it and
// stops. Its names are unique, so that parallel runs do not meet.
func TestRunReloadsAndStops(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := pc.LocalAddr().(*net.UDPAddr).Port
	pc.Close() // nobody listens there now
	name := fmt.Sprintf("svc-test-%d", time.Now().UnixNano())
	res := fmt.Sprintf(`apiVersion: connector.weida.dev/v1alpha1
kind: Connector
metadata: {name: %s}
spec:
  protocol: nats
  direction: outbound
  broker: {url: "nats://127.0.0.1:4222"}
  weida: {dial: "weida://sha256:9091e5f37dc3e870fcce55bf2721bd5db9e7ba9067b3b8067fd12f0153a52b98@127.0.0.1:%d/x"}
  conversion: {losses: [at-most-once, delivery-best-effort, empty-segments, forbidden-chars, ordering, wildcard-names]}
  routes: [{filter: %s.*}]
`, name, port, name)
	file := t.TempDir() + "/r.yaml"
	if err := os.WriteFile(file, []byte(res), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	reload := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- service.Run(ctx, service.Config{Env: env(nil), Paths: []string{file}, Admin: "127.0.0.1:0", Drain: time.Second}, reload)
	}()
	select {
	case reload <- struct{}{}: // taken once the first load ran
	case err := <-done:
		t.Fatalf("Run returned %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not take the reload")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not stop")
	}
}

// TestUnitsErrorUnwraps: each resource's error stays reachable through
// errors.Is and errors.As, so a caller can tell a missing driver from a
// missing secret without reading the text.
func TestUnitsErrorUnwraps(t *testing.T) {
	vars := map[string]string{"AMQP_PASSWORD": "x", "NATS_TOKEN": "x", "MQTT_PASSWORD": "x"}
	_, err := service.Units(loadExamples(t), env(vars, nats.Driver))
	var ue *service.UnitsError
	if !errors.As(err, &ue) {
		t.Fatalf("Units = %v, want a *UnitsError", err)
	}
	if !errors.Is(err, service.ErrNoDriver) {
		t.Errorf("errors.Is(%q, ErrNoDriver) = false", err)
	}
	if got := len(ue.Unwrap()); got != len(ue.Lines) || got == 0 {
		t.Errorf("Unwrap gives %d errors for %d lines", got, len(ue.Lines))
	}
	if _, err := service.Units(loadExamples(t), env(nil)); errors.Is(err, service.ErrNoDriver) {
		t.Errorf("missing secrets match ErrNoDriver: %v", err)
	}
}

// TestUnitsReadSecretsAtEachAttempt: a unit lists its secret files, and
// each attempt's factory after the first reads them again: a secret that can no longer be
// read fails that attempt with SecretUnavailable, naming the file, a
// retryable failure; once readable, the next attempt builds its Source.
func TestUnitsReadSecretsAtEachAttempt(t *testing.T) {
	dir := t.TempDir()
	src, err := os.ReadFile("../examples/mqtt-inbound.yaml")
	if err != nil {
		t.Fatal(err)
	}
	yaml := strings.Replace(string(src), "    mqtt:\n", "    credentials:\n      username: bridge\n      password: {file: password}\n    mqtt:\n", 1)
	yaml = strings.NewReplacer("certFile: certs/endpoint.crt", "", "keyFile: certs/endpoint.key", "").Replace(yaml)
	if err := os.WriteFile(dir+"/r.yaml", []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	secret := dir + "/password"
	if err := os.WriteFile(secret, []byte("one\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	set, err := resources.Load(service.Protocols(drivers()), dir)
	if err != nil {
		t.Fatal(err)
	}
	units, err := service.Units(set.Connectors(), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	u := units[0]
	if len(u.Files) != 1 || u.Files[0] != secret {
		t.Fatalf("unit files %q, want [%s]", u.Files, secret)
	}
	// The first attempt uses the secrets Units read.
	first, err := u.NewSource(nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = first.Close(context.Background())
	if err := os.Remove(secret); err != nil {
		t.Fatal(err)
	}
	_, err = u.NewSource(nil)
	reason, permanent := connectors.Classify(err, "")
	if reason != connectors.FailSecretUnavailable || permanent || !strings.Contains(err.Error(), secret) {
		t.Fatalf("an attempt with the secret file gone: %v (%s, permanent %t); want a retryable SecretUnavailable naming %s", err, reason, permanent, secret)
	}
	if err := os.WriteFile(secret, []byte("two\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := u.NewSource(nil)
	if err != nil {
		t.Fatalf("an attempt with the secret file back: %v", err)
	}
	_ = s.Close(context.Background())
}

// TestUnitCarriesEndpointLimits: an inbound resource's endpoint settings
// reach the weida listener its unit starts: the connection limits and the
// idle timeout (issue 21: 1,000 saturated readers kept at 10 s, lost at
// the default 2 s).
func TestUnitCarriesEndpointLimits(t *testing.T) {
	cs := loadExamples(t)
	var in *resources.Connector
	for _, c := range cs {
		if c.Direction == policy.Inbound {
			in = c
			break
		}
	}
	if in == nil {
		t.Fatal("no inbound example")
	}
	in.Weida.IdleTimeout = 10 * time.Second
	in.Weida.MaxConnections, in.Weida.MaxConnectionsPerAddress = 4096, 16
	units, err := service.Units([]*resources.Connector{in}, env(map[string]string{"AMQP_PASSWORD": "guest"}))
	if err != nil {
		t.Fatal(err)
	}
	if l := units[0].ListenConfig.Limits; l.IdleTimeout != 10*time.Second || l.MaxConnections != 4096 || l.MaxConnectionsPerAddress != 16 {
		t.Errorf("listener limits %+v, want idle timeout 10s and connections 4096, 16 per address", l)
	}
}
