// Package demo runs the whole bridge in one process, on embedded brokers,
// to show what the connector does without installing anything. It links an
// MQTT 5 broker (mochi-mqtt) and a NATS server into whatever imports it, so
// only the connector-demo command does: the production binary must not
// carry them (a test in cmd/connector checks its dependencies).
package demo

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/eclipse/paho.golang/paho"
	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"weida.dev/connector/cmd/drivers"
	"weida.dev/connector/connectors"
	"weida.dev/connector/policy"
	"weida.dev/connector/resources"
	"weida.dev/connector/service"
	"weida.dev/connector/weida"
)

// Options configures [Run]. The zero value is valid: it discards the
// narrative and the log.
type Options struct {
	// Out receives what the demo shows: the brokers it started, the
	// resources it accepted and refused, each message and how it converted
	// or why it was dropped, and the counters. Nil discards it.
	Out io.Writer
	// Logger receives the connector runtime's own log lines. Nil discards
	// them.
	Logger *slog.Logger
}

// timeout bounds a whole run: every step waits seconds at most, so a demo
// still going after this is stuck, not slow.
const timeout = 60 * time.Second

// Run starts an embedded MQTT 5 broker and an embedded NATS server on
// loopback ports chosen at random, loads demo resources through
// resources.Load as `connector run` loads files, runs them with the
// runtime and the drivers of the connector ([drivers.All]), and drives
// traffic through them from weida subscribers, a weida publisher and
// broker clients, writing what happens to opts.Out. It needs no broker and
// listens on 127.0.0.1 only.
//
// Run returns nil when every message crossed, was dropped or was refused
// as the resources state; otherwise an error counting the expectations
// that failed (each one is also written to opts.Out), or the error that
// stopped it. It returns after a minute at most, and only once everything
// it started has stopped and its temporary files are removed.
func Run(ctx context.Context, opts Options) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	d := &demo{out: opts.Out, log: opts.Logger}
	if d.out == nil {
		d.out = io.Discard
	}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	defer d.cleanup()
	return d.run(ctx)
}

type demo struct {
	out      io.Writer
	log      *slog.Logger
	closers  []func()
	mu       sync.Mutex
	failures []string
}

func (d *demo) defer_(f func()) { d.closers = append(d.closers, f) }

func (d *demo) cleanup() {
	for i := len(d.closers) - 1; i >= 0; i-- {
		d.closers[i]()
	}
}

func (d *demo) printf(format string, a ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	fmt.Fprintf(d.out, format, a...)
}

func (d *demo) fail(format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	d.mu.Lock()
	d.failures = append(d.failures, msg)
	d.mu.Unlock()
	d.printf("  !! %s\n", msg)
}

// The demo resources, loaded through resources.Load exactly as `run` loads
// files. %[n]s are filled with ports and paths chosen at start.
const demoResources = `apiVersion: connector.weida.dev/v1alpha1
kind: Connector
metadata: {name: demo-mqtt-sensors-in}
spec:
  protocol: mqtt
  direction: inbound
  broker:
    url: mqtt://127.0.0.1:%[1]d
    clientID: demo-sensors-in
    mqtt: {qos: 1, cleanStart: true, sessionExpiry: 0s}
  weida: {listen: "weida://127.0.0.1:%[3]d/sensors", certFile: %[5]s, keyFile: %[6]s}
  # Retained readings are kept and replayed to each new weida subscriber,
  # so retain is not among the losses.
  lastValue: {mode: retained}
  conversion:
    policy: mqtt-levels/v1
    losses: [delivery-best-effort, dotted-levels, expiry, ordering, properties, reply-to, topic-length]
  routes:
    - {name: temperature, filter: "sensors/+/temperature"}
    - {name: factory, filter: "factory/#"}
---
apiVersion: connector.weida.dev/v1alpha1
kind: Connector
metadata: {name: demo-nats-orders-in}
spec:
  protocol: nats
  direction: inbound
  broker: {url: "nats://127.0.0.1:%[2]d"}
  weida: {listen: "weida://127.0.0.1:%[3]d/orders", certFile: %[5]s, keyFile: %[6]s}
  conversion:
    # The opt-in tail policy carries NATS's one-or-more '>' exactly, and the
    # mount places this server's orders.* under weida's shop.orders.*.
    policy: nats-tokens-tail/v1
    mount: {foreign: "orders.", weida: "shop.orders."}
    losses: %[8]s
  routes:
    - {name: created, filter: "orders.*.created"}
    - {name: europe, filter: "orders.eu.>"}
---
apiVersion: connector.weida.dev/v1alpha1
kind: Connector
metadata: {name: demo-mqtt-alerts-out}
spec:
  protocol: mqtt
  direction: outbound
  broker:
    url: mqtt://127.0.0.1:%[1]d
    clientID: demo-alerts-out
    mqtt: {qos: 1}
  weida: {dial: "weida://%[7]s@127.0.0.1:%[4]d/alerts"}
  conversion:
    policy: mqtt-levels/v1
    losses: %[9]s
  routes:
    - {name: alerts, filter: "alerts/#"}
`

// A resource the demo shows being refused, as `check` and `run` would.
const demoRefused = `apiVersion: connector.weida.dev/v1alpha1
kind: Connector
metadata: {name: demo-nats-all-orders}
spec:
  protocol: nats
  direction: inbound
  broker: {url: "nats://127.0.0.1:4222"}
  weida: {listen: "weida://127.0.0.1:7999/all-orders"}
  conversion: {policy: nats-tokens/v1, losses: %s}
  routes:
    - {name: everything, filter: "orders.>"}
`

// stage is what the demo's steps have set up so far: each step reads what
// earlier ones left and adds its own.
type stage struct {
	mqttPort, natsPort int
	// inPort is the UDP port the inbound resources' weida endpoints share.
	inPort int
	dir    string
	// The endpoint certificate the inbound resources present, and the
	// fingerprint their weida subscribers pin.
	certFile, keyFile, fingerprint string
	app                            *weida.Listener  // the weida application
	alerts                         *weida.Publisher // its /alerts, which the outbound resource dials
	resFile, refusedFile           string
	set                            *resources.Set
	rt                             *connectors.Runtime
	mq                             *paho.Client
	nc                             *nats.Conn
	sensors, orders                *weida.Subscriber // on the inbound resources' endpoints
	alertsOnMQTT                   <-chan *paho.Publish
}

// run is the demo: its steps in the order the narrative tells them. A step
// returns an error only when the demo cannot go on; an expectation that
// fails is recorded (d.fail) and the demo continues.
func (d *demo) run(ctx context.Context) error {
	d.printf("weida-connector demo: brokers, connector and weida peers all run in this process, on loopback.\n\n")
	s := &stage{}
	for _, step := range []func(context.Context, *stage) error{
		d.startBrokers,
		d.startApplication,
		d.writeResources,
		d.checkResources,
		d.runResources,
		d.retainBeforeSubscriber,
		d.connectClients,
		d.showReplay,
		d.sendInbound,
		d.sendOutbound,
		d.summarize,
	} {
		if err := step(ctx, s); err != nil {
			return err
		}
	}
	if len(d.failures) > 0 {
		return fmt.Errorf("%d expectation(s) failed", len(d.failures))
	}
	d.printf("\nEverything behaved as the resources state. Next: README's five-minute tour.\n")
	return nil
}

// startBrokers starts the embedded MQTT broker and NATS server, and writes
// the endpoint certificate into a temporary directory.
func (d *demo) startBrokers(_ context.Context, s *stage) error {
	var err error
	if s.mqttPort, err = d.startMQTT(); err != nil {
		return err
	}
	if s.natsPort, err = d.startNATS(); err != nil {
		return err
	}
	if s.dir, err = os.MkdirTemp("", "connector-demo"); err != nil {
		return err
	}
	d.defer_(func() { os.RemoveAll(s.dir) })
	s.certFile, s.keyFile, s.fingerprint, err = writeDemoCert(s.dir)
	return err
}

// startApplication starts a weida application publishing alerts; the
// outbound resource dials it.
func (d *demo) startApplication(ctx context.Context, s *stage) error {
	app, err := weida.Listen(ctx, "127.0.0.1:0", weida.ListenConfig{CertFile: s.certFile, KeyFile: s.keyFile})
	if err != nil {
		return err
	}
	d.defer_(func() { app.Close() })
	s.app = app
	s.alerts, err = app.Publisher("/alerts")
	return err
}

func (s *stage) appPort() int { return s.app.Addr().(*net.UDPAddr).Port }

// writeResources writes the demo's resources, filled with the ports and
// files chosen at start, and the one it shows refused.
func (d *demo) writeResources(_ context.Context, s *stage) error {
	var err error
	if s.inPort, err = freeUDPPort(); err != nil {
		return err
	}
	natsLosses := lossesFor(policy.NATSTokensV1(), policy.Mount{}, "inbound")
	natsMountedLosses := lossesFor(policy.NATSTail(), policy.Mount{Foreign: "orders.", Weida: "shop.orders."}, "inbound")
	mqttOutLosses := lossesFor(policy.MQTTLevelsV1(), policy.Mount{}, "outbound")
	yaml := fmt.Sprintf(demoResources, s.mqttPort, s.natsPort, s.inPort, s.appPort(),
		s.certFile, s.keyFile, s.fingerprint, natsMountedLosses, mqttOutLosses)
	s.resFile = filepath.Join(s.dir, "demo.yaml")
	s.refusedFile = filepath.Join(s.dir, "refused.yaml")
	if err := os.WriteFile(s.resFile, []byte(yaml), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(s.refusedFile, []byte(fmt.Sprintf(demoRefused, natsLosses)), 0o600); err != nil {
		return err
	}
	d.printf("  embedded MQTT 5 broker (mochi-mqtt)  mqtt://127.0.0.1:%d\n", s.mqttPort)
	d.printf("  embedded NATS server                 nats://127.0.0.1:%d\n", s.natsPort)
	d.printf("  a weida application publishing       weida://127.0.0.1:%d/alerts\n\n", s.appPort())
	return nil
}

// checkResources is configuration time: the refused resource never runs,
// and the valid ones are shown as the connector reads them.
func (d *demo) checkResources(_ context.Context, s *stage) error {
	d.printf("1. Checking resources, as `connector check` and `connector run` do\n\n")
	if _, err := resources.Load(service.Protocols(drivers.All()), s.refusedFile); err == nil {
		d.fail("the resource with route orders.> was accepted")
	} else {
		for _, fe := range resources.Errors(err) {
			d.printf("  REFUSED  %s: %s = %q\n           %s [%s]\n           hint: %s\n", fe.Resource, fe.Field, fe.Value, fe.Message, fe.Rule, fe.Hint)
		}
	}
	set, err := resources.Load(service.Protocols(drivers.All()), s.resFile)
	if err != nil {
		return fmt.Errorf("demo resources: %w", err)
	}
	s.set = set
	for _, c := range set.Connectors() {
		d.describe(c)
	}
	d.printf("\n")
	return nil
}

// describe shows one valid resource: its policy, options, routes and losses.
func (d *demo) describe(c *resources.Connector) {
	d.printf("  valid    %-22s %-3s %-8s %s\n", c.Name, c.Protocol, c.Direction, c.Policy.Name())
	if c.LastValue.Mode != "" {
		d.printf("           last value: %s messages are kept and replayed to new weida subscribers\n", c.LastValue.Mode)
	}
	if c.Mount != (policy.Mount{}) {
		d.printf("           mount %q (broker) <-> %q (weida)\n", c.Mount.Foreign, c.Mount.Weida)
	}
	for _, r := range c.Routes {
		d.printf("           route %-12s %-24s -> weida %s\n", r.Name, r.Foreign, r.Weida)
	}
	d.printf("           declared losses: %s\n", joinLosses(c))
}

// runResources runs the valid resources and waits until each is Ready.
func (d *demo) runResources(ctx context.Context, s *stage) error {
	units, err := service.Units(s.set.Connectors(), service.Env{Drivers: drivers.All(), LoopMarker: "demo", Logger: d.log})
	if err != nil {
		return err
	}
	s.rt = connectors.NewRuntime(connectors.Deps{Metrics: connectors.NewMetrics(prometheus.NewRegistry()), Logger: d.log, Drain: 2 * time.Second})
	if err := s.rt.Apply(ctx, units); err != nil {
		return err
	}
	d.defer_(s.rt.Stop)
	if err := waitFor(ctx, 15*time.Second, s.rt.Ready); err != nil {
		for _, st := range s.rt.Statuses() {
			if !st.Ready() {
				d.fail("%s not ready: %+v", st.Name, st.Conditions)
			}
		}
		return errors.New("the connector did not become ready")
	}
	d.printf("2. Running: every resource is Ready (broker connected, weida side up)\n\n")
	return nil
}

// A retained reading the demo publishes before any weida subscriber
// exists: the connector keeps it and replays it to the subscriber that
// comes.
const atticTopic, atticPayload = "sensors/attic/temperature", `{"c":30.1}`

// retainBeforeSubscriber publishes the retained reading and waits until
// the inbound resource has cached it.
func (d *demo) retainBeforeSubscriber(ctx context.Context, s *stage) error {
	mq, err := d.mqttPublisher(ctx, s.mqttPort)
	if err != nil {
		return err
	}
	s.mq = mq
	if _, err := mq.Publish(ctx, &paho.Publish{Topic: atticTopic, QoS: 1, Retain: true, Payload: []byte(atticPayload)}); err != nil {
		return err
	}
	if err := waitFor(ctx, 5*time.Second, func() bool { return lastValues(s.rt, "demo-mqtt-sensors-in") > 0 }); err != nil {
		d.fail("the retained reading was not cached")
	}
	return nil
}

// lastValues is how many last values the named resource keeps.
func lastValues(rt *connectors.Runtime, name string) uint64 {
	for _, st := range rt.Statuses() {
		if lv := st.Counters.LastValue; st.Name == name && lv != nil {
			return uint64(lv.Entries)
		}
	}
	return 0
}

// connectClients dials weida subscribers on the two hosted endpoints and
// subscribes an MQTT client to what the outbound resource publishes.
func (d *demo) connectClients(ctx context.Context, s *stage) error {
	var err error
	if s.sensors, err = d.dialWeida(ctx, s.fingerprint, s.inPort, "/sensors", "sensors.#", "factory.#"); err != nil {
		return err
	}
	if s.orders, err = d.dialWeida(ctx, s.fingerprint, s.inPort, "/orders", ""); err != nil {
		return err
	}
	if s.alertsOnMQTT, err = d.subscribeMQTT(ctx, s.mqttPort, "alerts/#"); err != nil {
		return err
	}
	_ = waitFor(ctx, 5*time.Second, func() bool { return s.alerts.Subscribers() > 0 })
	s.nc, err = nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d", s.natsPort))
	if err != nil {
		return err
	}
	d.defer_(s.nc.Close)
	return nil
}

// showReplay expects the retained reading as the new subscriber's first
// message.
func (d *demo) showReplay(ctx context.Context, s *stage) error {
	d.printf("3. Traffic (foreign topic -> weida topic, or why it was dropped)\n\n")
	switch got, ok := receiveWithin(ctx, s.sensors, 5*time.Second); {
	case !ok:
		d.fail("the retained %s was not replayed to the new weida subscriber", atticTopic)
	case got.Topic != "sensors.attic.temperature" || string(got.Payload) != atticPayload:
		d.fail("the replay brought %q %q", got.Topic, got.Payload)
	default:
		d.printf("  %-4s %-30s  -> weida %-28s %s  (retained before the subscriber came: replayed)\n", "MQTT", atticTopic, got.Topic, got.Payload)
	}
	return nil
}

// inboundMessage is one message the demo publishes on a broker, and what
// its weida subscriber must see.
type inboundMessage struct {
	proto, topic, payload string
	sub                   *weida.Subscriber
	want                  string // weida topic, or "" when it must be dropped
}

// sendInbound publishes messages on both brokers, each converted or
// dropped as the resources state.
func (d *demo) sendInbound(ctx context.Context, s *stage) error {
	for _, m := range []inboundMessage{
		{"MQTT", "sensors/kitchen/temperature", `{"c":21.5}`, s.sensors, "sensors.kitchen.temperature"},
		{"MQTT", "sensors//temperature", `{"c":19.0}`, s.sensors, "sensors..temperature"},
		{"MQTT", "factory", `line stopped`, s.sensors, "factory"},
		{"MQTT", "factory/hall-2/press", `{"bar":3}`, s.sensors, "factory.hall-2.press"},
		{"MQTT", "sensors/eu.west/temperature", `{"c":9.1}`, s.sensors, ""},
		{"NATS", "orders.us.created", `{"id":1}`, s.orders, "shop.orders.us.created"},
		{"NATS", "orders.eu.fr.shipped", `{"id":2}`, s.orders, "shop.orders.eu.fr.shipped"},
		{"NATS", "orders.us.ca.shipped", `{"id":3}`, s.orders, ""},
	} {
		if err := s.publish(ctx, m); err != nil {
			return err
		}
		if m.want == "" {
			d.expectDropped(ctx, m)
		} else {
			d.expectBridged(ctx, m)
		}
	}
	return nil
}

// publish sends m on its broker.
func (s *stage) publish(ctx context.Context, m inboundMessage) error {
	if m.proto == "MQTT" {
		_, err := s.mq.Publish(ctx, &paho.Publish{Topic: m.topic, QoS: 1, Payload: []byte(m.payload)})
		return err
	}
	if err := s.nc.Publish(m.topic, []byte(m.payload)); err != nil {
		return err
	}
	_ = s.nc.Flush()
	return nil
}

// expectDropped expects m to reach no weida subscriber, and says why.
func (d *demo) expectDropped(ctx context.Context, m inboundMessage) {
	why := "not selected by any route"
	if m.proto == "MQTT" {
		why = "dropped and counted: mqtt-dotted-level (a '.' inside a level would become a weida separator)"
	}
	if got, ok := receiveWithin(ctx, m.sub, 400*time.Millisecond); ok {
		d.fail("%s %s reached weida as %q", m.proto, m.topic, got.Topic)
		return
	}
	d.printf("  %-4s %-30s  x  %s\n", m.proto, m.topic, why)
}

// expectBridged expects m at its weida subscriber under the weida topic it
// converts to.
func (d *demo) expectBridged(ctx context.Context, m inboundMessage) {
	got, ok := receiveWithin(ctx, m.sub, 5*time.Second)
	switch {
	case !ok:
		d.fail("%s %s did not reach weida", m.proto, m.topic)
	case got.Topic != m.want || string(got.Payload) != m.payload:
		d.fail("%s %s arrived as %q %q, want %q", m.proto, m.topic, got.Topic, got.Payload, m.want)
	default:
		d.printf("  %-4s %-30s  -> weida %-28s %s\n", m.proto, m.topic, got.Topic, got.Payload)
	}
}

// sendOutbound publishes on the weida application and expects each
// message on MQTT through the outbound resource.
func (d *demo) sendOutbound(ctx context.Context, s *stage) error {
	for _, a := range []struct{ topic, payload, want string }{
		{"alerts.fire.hall-2", `evacuate`, "alerts/fire/hall-2"},
		{"alerts", `all clear`, "alerts"},
	} {
		if _, err := s.alerts.Publish(ctx, weida.Message{Topic: a.topic, Payload: []byte(a.payload)}); err != nil {
			return err
		}
		select {
		case m := <-s.alertsOnMQTT:
			if m.Topic != a.want {
				d.fail("weida %s arrived on MQTT as %q, want %q", a.topic, m.Topic, a.want)
			} else {
				d.printf("  weida %-29s  -> MQTT  %-28s %s\n", a.topic, m.Topic, m.Payload)
			}
		case <-time.After(5 * time.Second):
			d.fail("weida %s did not reach MQTT", a.topic)
		}
	}
	return nil
}

// summarize prints every resource's counters once they have settled.
func (d *demo) summarize(ctx context.Context, s *stage) error {
	// A subscriber can see a message before the bridge has its broker
	// acknowledgement; let the counters settle before printing them.
	_ = waitFor(ctx, 3*time.Second, func() bool { return settled(s.rt) })
	d.printf("\n4. Summary (also served as /status and /metrics by `connector run`)\n\n")
	for _, st := range s.rt.Statuses() {
		c := st.Counters
		d.printf("  %-22s received %d, bridged %d, dropped %s", st.Name, c.Received, c.Bridged, formatDrops(c.Dropped))
		if lv := c.LastValue; lv != nil {
			d.printf(", last values kept %d, replayed %d", lv.Entries, lv.Replayed)
		}
		d.printf("\n")
	}
	return nil
}

// settled reports whether every message each resource received was
// bridged or dropped, with nothing in flight.
func settled(rt *connectors.Runtime) bool {
	for _, st := range rt.Statuses() {
		c := st.Counters
		var dropped uint64
		for _, n := range c.Dropped {
			dropped += n
		}
		if c.InFlight != 0 || c.Bridged+dropped < c.Received {
			return false
		}
	}
	return true
}

func formatDrops(m map[string]uint64) string {
	if len(m) == 0 {
		return "0"
	}
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%d (%s)", v, k))
	}
	slices.Sort(parts) // map order is random; the demo's output is not
	return strings.Join(parts, ", ")
}

func joinLosses(c *resources.Connector) string {
	s := make([]string, len(c.Losses))
	for i, l := range c.Losses {
		s[i] = string(l)
	}
	return strings.Join(s, ", ")
}

func waitFor(ctx context.Context, d time.Duration, cond func() bool) error {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return errors.New("timed out")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

func receiveWithin(ctx context.Context, s *weida.Subscriber, d time.Duration) (weida.Message, bool) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	m, err := s.Receive(ctx)
	return m, err == nil
}

func freeUDPPort() (int, error) {
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port, nil
}

func freeTCPPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (d *demo) startMQTT() (int, error) {
	port, err := freeTCPPort()
	if err != nil {
		return 0, err
	}
	srv := mochi.New(&mochi.Options{InlineClient: false, Logger: slog.New(slog.DiscardHandler)})
	if err := srv.AddHook(new(auth.AllowHook), nil); err != nil {
		return 0, err
	}
	if err := srv.AddListener(listeners.NewTCP(listeners.Config{ID: "demo", Address: fmt.Sprintf("127.0.0.1:%d", port)})); err != nil {
		return 0, err
	}
	if err := srv.Serve(); err != nil {
		return 0, fmt.Errorf("embedded MQTT broker: %w", err)
	}
	d.defer_(func() { srv.Close() })
	return port, nil
}

func (d *demo) startNATS() (int, error) {
	srv, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		return 0, err
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		return 0, errors.New("embedded NATS server did not start")
	}
	d.defer_(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return srv.Addr().(*net.TCPAddr).Port, nil
}

func (d *demo) dialWeida(ctx context.Context, fingerprint string, port int, path string, filters ...string) (*weida.Subscriber, error) {
	s, err := weida.Dial(ctx, fmt.Sprintf("weida://%s@127.0.0.1:%d%s", fingerprint, port, path), weida.DialConfig{})
	if err != nil {
		return nil, err
	}
	d.defer_(func() { s.Close() })
	for _, f := range filters {
		if err := s.Subscribe(ctx, f); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (d *demo) mqttClient(ctx context.Context, port int, id string, onPublish func(paho.PublishReceived) (bool, error)) (*paho.Client, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return nil, err
	}
	cfg := paho.ClientConfig{ClientID: id, Conn: conn}
	if onPublish != nil {
		cfg.OnPublishReceived = []func(paho.PublishReceived) (bool, error){onPublish}
	}
	c := paho.NewClient(cfg)
	if _, err := c.Connect(ctx, &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30}); err != nil {
		conn.Close()
		return nil, err
	}
	d.defer_(func() { c.Disconnect(&paho.Disconnect{}) })
	return c, nil
}

func (d *demo) mqttPublisher(ctx context.Context, port int) (*paho.Client, error) {
	return d.mqttClient(ctx, port, "demo-publisher", nil)
}

func (d *demo) subscribeMQTT(ctx context.Context, port int, filter string) (<-chan *paho.Publish, error) {
	ch := make(chan *paho.Publish, 16)
	c, err := d.mqttClient(ctx, port, "demo-alerts-reader", func(pr paho.PublishReceived) (bool, error) {
		select {
		case ch <- pr.Packet:
		default:
		}
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	if _, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}}); err != nil {
		return nil, err
	}
	return ch, nil
}

// writeDemoCert writes a self-signed certificate for 127.0.0.1 and returns
// its files and weida fingerprint.
func writeDemoCert(dir string) (certFile, keyFile, fingerprint string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "weida-connector demo"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", "", "", err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return "", "", "", err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", "", err
	}
	certFile, keyFile = filepath.Join(dir, "demo.crt"), filepath.Join(dir, "demo.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return "", "", "", err
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return "", "", "", err
	}
	return certFile, keyFile, weida.Fingerprint(cert), nil
}

// lossesFor renders, as a YAML flow list, the losses p incurs under mount m
// (the zero Mount for none) in direction with the demo's options (MQTT QoS
// 1, core NATS): the demo states exactly what its conversions lose, as
// every resource must.
func lossesFor(p policy.Policy, m policy.Mount, direction string) string {
	if m != (policy.Mount{}) {
		mp, err := policy.NewMounted(p, m)
		if err != nil {
			panic(err) // the demo's own constant mount
		}
		p = mp
	}
	ls := p.Losses(policy.Direction(direction), policy.Options{QoS: 1})
	s := make([]string, len(ls))
	for i, l := range ls {
		s[i] = string(l)
	}
	return "[" + strings.Join(s, ", ") + "]"
}
