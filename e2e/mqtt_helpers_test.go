package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"weida.dev/connector/connectors/mqtt"
	"weida.dev/connector/policy"
)

// mosquittoAddr is the loopback Mosquitto that scripts/brokers starts.
const mosquittoAddr = "127.0.0.1:1883"

// mqttResource describes one MQTT Connector resource for a test; YAML
// renders it.
type mqttResource struct {
	Name      string
	Direction policy.Direction // inbound or outbound
	Broker    string           // host:port; empty means mosquittoAddr
	ClientID  string           // empty means Name plus a random suffix
	QoS       int              // 0 or 1; the zero value is QoS 0
	Policy    string           // empty means mqtt-levels/v1
	Mount     policy.Mount     // spec.conversion.mount; zero means none
	// Endpoint is the weida URL: listen (inbound) or dial (outbound).
	Endpoint          string
	CertFile, KeyFile string // inbound: the endpoint's identity; empty generates one
	Routes            []mqttRoute
	CleanStart        bool
	SharedGroup       string     // inbound: mqtt.sharedGroup
	SessionExpiry     string     // empty means 60s
	MaxMessageBytes   string     // empty means the default
	BufferBytes       string     // empty means the default
	InFlight          int        // zero means the default
	TLS               *brokerPKI // set: mqtts:// with the PKI's CA and client certificate
	// LastValue (inbound) is the body of spec.lastValue, one "key: value"
	// per line, e.g. "mode: retained"; empty means no cache.
	LastValue string
	Retain    bool // outbound: mqtt.retain
	Hold      bool // inbound: spec.delivery.whenNoSubscriber: hold
}

type mqttRoute struct{ Name, Filter string }

// YAML renders the resource, declaring exactly the losses its policy incurs.
func (r mqttResource) YAML(t testing.TB) string {
	t.Helper()
	pname := r.Policy
	if pname == "" {
		pname = policy.MQTTLevels
	}
	p, err := policy.Lookup(mqtt.Driver.Policies(), pname)
	if err != nil {
		t.Fatal(err)
	}
	if r.Mount != (policy.Mount{}) {
		if p, err = policy.NewMounted(p, r.Mount); err != nil {
			t.Fatal(err)
		}
	}
	broker := r.Broker
	if broker == "" {
		broker = mosquittoAddr
	}
	id := r.ClientID
	if id == "" {
		id = r.Name + "-" + unique()
	}
	expiry := r.SessionExpiry
	if expiry == "" {
		expiry = "60s"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: connector.weida.dev/v1alpha1\nkind: Connector\nmetadata:\n  name: %s\nspec:\n", r.Name)
	fmt.Fprintf(&b, "  protocol: mqtt\n  direction: %s\n", r.Direction)
	scheme := "mqtt"
	if r.TLS != nil {
		scheme = "mqtts"
	}
	fmt.Fprintf(&b, "  broker:\n    url: %s://%s\n    clientID: %s\n", scheme, broker, id)
	b.WriteString(r.TLS.yaml())
	fmt.Fprintf(&b, "    mqtt:\n      qos: %d\n", r.QoS)
	if r.Direction == policy.Inbound {
		fmt.Fprintf(&b, "      cleanStart: %t\n      sessionExpiry: %s\n", r.CleanStart, expiry)
		if r.SharedGroup != "" {
			fmt.Fprintf(&b, "      sharedGroup: %s\n", r.SharedGroup)
		}
		fmt.Fprintf(&b, "  weida:\n    listen: %s\n", r.Endpoint)
		if r.CertFile != "" {
			fmt.Fprintf(&b, "    certFile: %s\n    keyFile: %s\n", r.CertFile, r.KeyFile)
		}
	} else {
		if r.Retain {
			b.WriteString("      retain: true\n")
		}
		fmt.Fprintf(&b, "  weida:\n    dial: %s\n", r.Endpoint)
	}
	if r.LastValue != "" {
		b.WriteString("  lastValue:\n")
		for line := range strings.SplitSeq(r.LastValue, "\n") {
			fmt.Fprintf(&b, "    %s\n", line)
		}
	}
	if r.Hold {
		b.WriteString("  delivery:\n    whenNoSubscriber: hold\n")
	}
	fmt.Fprintf(&b, "  conversion:\n    policy: %s\n", pname)
	if r.Mount != (policy.Mount{}) {
		fmt.Fprintf(&b, "    mount: {foreign: %q, weida: %q}\n", r.Mount.Foreign, r.Mount.Weida)
	}
	b.WriteString("    losses:\n")
	for _, l := range p.Losses(r.Direction, policy.Options{QoS: r.QoS, LastValue: r.LastValue != ""}) {
		fmt.Fprintf(&b, "      - %s\n", l)
	}
	b.WriteString("  routes:\n")
	for _, rt := range r.Routes {
		fmt.Fprintf(&b, "    - filter: %q\n", rt.Filter)
		if rt.Name != "" {
			fmt.Fprintf(&b, "      name: %s\n", rt.Name)
		}
	}
	if r.MaxMessageBytes != "" || r.BufferBytes != "" || r.InFlight != 0 {
		b.WriteString("  limits:\n")
		if r.MaxMessageBytes != "" {
			fmt.Fprintf(&b, "    maxMessageBytes: %s\n", r.MaxMessageBytes)
		}
		if r.BufferBytes != "" {
			fmt.Fprintf(&b, "    bufferBytes: %s\n", r.BufferBytes)
		}
		if r.InFlight != 0 {
			fmt.Fprintf(&b, "    inFlight: %d\n", r.InFlight)
		}
	}
	return b.String()
}

// mqttYAML joins resources into one multi-document file.
func mqttYAML(t testing.TB, rs ...mqttResource) string {
	t.Helper()
	docs := make([]string, len(rs))
	for i, r := range rs {
		docs[i] = r.YAML(t)
	}
	return strings.Join(docs, "---\n")
}

// mqttBufferedConn puts a read buffer in front of a connection (paho reads
// a packet a few bytes at a time, one system call each; see
// broker-baselines.md) and writes each packet whole. paho writes a packet
// as several slices and locks the connection around them when it is a
// sync.Locker; on a wrapper every slice is its own Write, so without the
// lock concurrent packets (a PUBLISH and a PINGREQ, say) interleave and
// Mosquitto disconnects with "malformed packet". Lock gathers a packet and
// Unlock sends it in one Write, as the connector's own driver does, so that
// the benchmark's direct baseline is as fast as the bridge's client.
type mqttBufferedConn struct {
	net.Conn
	r *bufio.Reader

	mu  sync.Mutex
	pkt []byte // guarded by mu
	err error  // guarded by mu
}

func newMQTTBufferedConn(c net.Conn) *mqttBufferedConn {
	return &mqttBufferedConn{Conn: c, r: bufio.NewReaderSize(c, 64<<10)}
}

func (c *mqttBufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func (c *mqttBufferedConn) Lock() { c.mu.Lock() }

// Write is called by paho with the lock held only.
func (c *mqttBufferedConn) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	c.pkt = append(c.pkt, p...)
	return len(p), nil
}

func (c *mqttBufferedConn) Unlock() {
	if len(c.pkt) > 0 && c.err == nil {
		if _, err := c.Conn.Write(c.pkt); err != nil {
			c.err = err
			c.Conn.Close()
		}
	}
	c.pkt = c.pkt[:0]
	c.mu.Unlock()
}

// mqttMsg is one MQTT message a test client received.
type mqttMsg struct {
	Topic   string
	Payload []byte
	QoS     byte
	SubIDs  []int
	Props   *paho.PublishProperties
}

// mqttClient is a plain paho client, bypassing the connector. It keeps what
// arrives when collect is set.
type mqttClient struct {
	*paho.Client
	mu   sync.Mutex
	msgs []mqttMsg
	// events records client errors and server disconnects, for failure
	// messages.
	events []string
	// onMsg, when set before the first delivery, sees every message.
	onMsg func(mqttMsg)
}

// mqttConnect connects a clean-start MQTT 5 client to addr. It is
// disconnected when the test ends.
func mqttConnect(t testing.TB, addr, id string) *mqttClient {
	t.Helper()
	c, err := mqttDial(ctx(t, 10*time.Second), addr, id, nil)
	if err != nil {
		t.Fatalf("mqtt connect %s: %v", addr, err)
	}
	t.Cleanup(c.close)
	return c
}

func mqttDial(ctx context.Context, addr, id string, onMsg func(mqttMsg)) (*mqttClient, error) {
	return mqttDialSession(ctx, addr, id, 0, onMsg)
}

// mqttDialSession is mqttDial with a session of its own: expiry 0 starts
// clean (the session ends with the connection), above 0 resumes the
// session the broker kept for id and keeps it that long after a
// disconnect, so that QoS 1 messages wait for the client's return.
func mqttDialSession(ctx context.Context, addr, id string, expiry uint32, onMsg func(mqttMsg)) (*mqttClient, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := &mqttClient{onMsg: onMsg}
	cfg := paho.ClientConfig{
		ClientID: id,
		Conn:     newMQTTBufferedConn(conn),
		OnClientError: func(err error) {
			c.mu.Lock()
			c.events = append(c.events, time.Now().Format("15:04:05.000")+" client error: "+err.Error())
			c.mu.Unlock()
		},
		OnServerDisconnect: func(d *paho.Disconnect) {
			c.mu.Lock()
			c.events = append(c.events, fmt.Sprintf("%s server disconnect: reason code 0x%02x", time.Now().Format("15:04:05.000"), d.ReasonCode))
			c.mu.Unlock()
		},
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			p := pr.Packet
			m := mqttMsg{Topic: p.Topic, Payload: p.Payload, QoS: p.QoS, Props: p.Properties}
			if p.Properties != nil {
				if p.Properties.SubscriptionIdentifier != nil {
					m.SubIDs = append(m.SubIDs, *p.Properties.SubscriptionIdentifier)
				}
			}
			if c.onMsg != nil {
				c.onMsg(m)
				return true, nil
			}
			c.mu.Lock()
			c.msgs = append(c.msgs, m)
			c.mu.Unlock()
			return true, nil
		}},
	}
	c.Client = paho.NewClient(cfg)
	cp := &paho.Connect{ClientID: id, CleanStart: expiry == 0, KeepAlive: 30}
	if expiry > 0 {
		cp.Properties = &paho.ConnectProperties{SessionExpiryInterval: &expiry}
	}
	ca, err := c.Connect(ctx, cp)
	if err != nil {
		conn.Close()
		return nil, err
	}
	if ca.ReasonCode >= 0x80 {
		conn.Close()
		return nil, fmt.Errorf("connack reason code 0x%02x", ca.ReasonCode)
	}
	return c, nil
}

func (c *mqttClient) close() {
	_ = c.Disconnect(&paho.Disconnect{})
	<-c.Done()
}

// subscribe subscribes filters at qos and fails the test on any refusal.
func (c *mqttClient) subscribe(t testing.TB, qos byte, filters ...string) {
	t.Helper()
	s := &paho.Subscribe{}
	for _, f := range filters {
		s.Subscriptions = append(s.Subscriptions, paho.SubscribeOptions{Topic: f, QoS: qos})
	}
	ack, err := c.Subscribe(ctx(t, 10*time.Second), s)
	if err != nil {
		t.Fatalf("mqtt subscribe %q: %v", filters, err)
	}
	for i, rc := range ack.Reasons {
		if rc >= 0x80 {
			t.Fatalf("mqtt subscribe %q: reason code 0x%02x", filters[i], rc)
		}
	}
}

// publish publishes one message and fails the test unless the broker took
// it (for QoS 1: a PUBACK without a failure code).
func (c *mqttClient) publish(t testing.TB, qos byte, topic, payload string) {
	t.Helper()
	resp, err := c.Publish(ctx(t, 10*time.Second), &paho.Publish{Topic: topic, QoS: qos, Payload: []byte(payload)})
	if err != nil {
		c.mu.Lock()
		ev := strings.Join(c.events, "; ")
		c.mu.Unlock()
		t.Fatalf("mqtt publish %q: %v (client events: %s)", topic, err, ev)
	}
	if resp != nil && resp.ReasonCode >= 0x80 {
		t.Fatalf("mqtt publish %q: reason code 0x%02x", topic, resp.ReasonCode)
	}
}

// Messages returns a copy of what arrived.
func (c *mqttClient) Messages() []mqttMsg {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]mqttMsg(nil), c.msgs...)
}

// Len returns how many messages arrived.
func (c *mqttClient) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.msgs)
}

// Has reports whether a message with topic and payload arrived.
func (c *mqttClient) Has(topic, payload string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.msgs {
		if m.Topic == topic && string(m.Payload) == payload {
			return true
		}
	}
	return false
}

// Reset forgets what arrived.
func (c *mqttClient) Reset() {
	c.mu.Lock()
	c.msgs = nil
	c.mu.Unlock()
}
