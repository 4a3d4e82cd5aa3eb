package amqp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"pgregory.net/rapid"

	"weida.dev/connector/connectors"
	"weida.dev/connector/connectors/conntest"
	"weida.dev/connector/resources"
)

// recorder collects a driver's state reports.
type recorder struct {
	mu  sync.Mutex
	all []connectors.ConnState
}

func (r *recorder) report(s connectors.ConnState) {
	r.mu.Lock()
	r.all = append(r.all, s)
	r.mu.Unlock()
}

// count returns how many reports satisfy pred.
func (r *recorder) count(pred func(connectors.ConnState) bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, s := range r.all {
		if pred(s) {
			n++
		}
	}
	return n
}

func (r *recorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fmt.Sprint(r.all)
}

func reason(want string) func(connectors.ConnState) bool {
	return func(s connectors.ConnState) bool { return s.Reason == want }
}

// waitFor polls cond every 10 ms for up to 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// cutter records the driver's network connections so that a test can cut
// them, as a failing network would.
type cutter struct {
	mu    sync.Mutex
	conns []net.Conn
}

func (c *cutter) dialed(conn net.Conn) {
	c.mu.Lock()
	c.conns = append(c.conns, conn)
	c.mu.Unlock()
}

func (c *cutter) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range c.conns {
		conn.Close()
	}
	c.conns = nil
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func closeSource(t *testing.T, s *Source) {
	t.Helper()
	if err := s.Close(testCtx(t)); err != nil {
		t.Errorf("Source.Close: %v", err)
	}
}

func closeSink(t *testing.T, s *Sink) {
	t.Helper()
	if err := s.Close(testCtx(t)); err != nil {
		t.Errorf("Sink.Close: %v", err)
	}
}

// queueDepth returns the ready messages of a queue, passively.
func queueDepth(t *testing.T, ch *amqp.Channel, name string) int {
	t.Helper()
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("inspecting queue %q: %v", name, err)
	}
	return q.Messages
}

func publish(t *testing.T, ch *amqp.Channel, key, body string) {
	t.Helper()
	if err := ch.PublishWithContext(testCtx(t), DefaultExchange, key, false, false, amqp.Publishing{Body: []byte(body)}); err != nil {
		t.Fatal(err)
	}
}

// durableSource starts a Source on a fresh durable queue bound with key.
func durableSource(t *testing.T, key string, mod func(*Config)) (*Source, *recorder, string) {
	t.Helper()
	requireBroker(t)
	name := "drv-" + conntest.Unique()
	cfg := testConfig(name, "")
	cfg.Queue = Queue{Name: name, Durable: true}
	if mod != nil {
		mod(&cfg)
	}
	t.Cleanup(func() { deleteQueue(t, name) })
	rec := &recorder{}
	src, err := NewSource(cfg, rec.report)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeSource(t, src) })
	if err := src.Start(testCtx(t), []string{key}); err != nil {
		t.Fatal(err)
	}
	return src, rec, name
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string // substring of the error; "" for valid
	}{
		{"minimal", Config{Host: "127.0.0.1"}, ""},
		{"vhost and tls", Config{Host: "broker.example", Port: 5671, VHost: "prod/eu", TLS: &tls.Config{}}, ""},
		{"named durable", Config{Host: loopback, Port: brokerPort, Queue: Queue{Name: "q", Durable: true}}, ""},
		{"quorum", Config{Host: loopback, Port: brokerPort, Queue: Queue{Name: "q", Durable: true, Quorum: true}}, ""},
		{"quorum not durable", Config{Host: loopback, Port: brokerPort, Queue: Queue{Name: "q", Quorum: true}}, "quorum queue"},
		{"named exclusive", Config{Host: loopback, Port: brokerPort, Queue: Queue{Name: "q", Exclusive: true}}, ""},
		{"max prefetch", Config{Host: loopback, Port: brokerPort, Prefetch: 65535}, ""},
		{"no host", Config{}, "host is required"},
		{"port too large", Config{Host: "::1", Port: 65536}, "out of range"},
		{"negative port", Config{Host: "::1", Port: -1}, "out of range"},
		{"durable without name", Config{Host: loopback, Port: brokerPort, Queue: Queue{Durable: true}}, "needs a name"},
		{"durable and exclusive", Config{Host: loopback, Port: brokerPort, Queue: Queue{Name: "q", Durable: true, Exclusive: true}}, "both durable and exclusive"},
		{"reserved queue", Config{Host: loopback, Port: brokerPort, Queue: Queue{Name: "amq.q"}}, "reserved"},
		{"negative prefetch", Config{Host: loopback, Port: brokerPort, Prefetch: -1}, "prefetch"},
		{"prefetch too large", Config{Host: loopback, Port: brokerPort, Prefetch: 65536}, "prefetch"},
		{"exchange too long", Config{Host: loopback, Port: brokerPort, Exchange: strings.Repeat("x", 256)}, "exchange"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewSource(tc.cfg, nil)
			_, err2 := NewSink(tc.cfg, nil)
			if (err == nil) != (err2 == nil) {
				t.Fatalf("NewSource and NewSink disagree: %v / %v", err, err2)
			}
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestConfigSecretNotInErrors(t *testing.T) {
	cfg := Config{Host: loopback, Port: 1, Password: "hunter2", Username: "user", ConnectTimeout: time.Second}
	rec := &recorder{}
	s, err := NewSink(cfg, rec.report)
	if err != nil {
		t.Fatal(err)
	}
	defer closeSink(t, s)
	err = s.Start(testCtx(t))
	if err == nil {
		t.Fatal("Start succeeded against a closed port")
	}
	wantFailure(t, err, "BrokerUnreachable")
	if rec.count(reason("BrokerUnreachable")) == 0 {
		t.Fatalf("the failure was not reported: %s", rec)
	}
	if strings.Contains(rec.String(), "hunter2") || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("a state report or the error reveals the password: %s / %v", rec, err)
	}
}

// wantFailure checks that err is a retryable *connectors.Failure for reason.
func wantFailure(t *testing.T, err error, reason string) *connectors.Failure {
	t.Helper()
	var f *connectors.Failure
	if !errors.As(err, &f) {
		t.Fatalf("error %v (%T) is not a *connectors.Failure; want %s", err, err, reason)
	}
	if f.Reason != reason || f.Permanent {
		t.Fatalf("failure %s (permanent %v): %v; want retryable %s", f.Reason, f.Permanent, err, reason)
	}
	return f
}

// startSource starts a Source with cfg bound with key.
func startSource(t *testing.T, cfg Config, key string) *Source {
	t.Helper()
	src, err := NewSource(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeSource(t, src) })
	if err := src.Start(testCtx(t), []string{key}); err != nil {
		t.Fatal(err)
	}
	return src
}

// TestSourceConnectionLost: when its connection is cut, a Source does not
// reconnect: Read fails with ConnectionLost. The delivery read on the lost
// channel cannot be settled any more (its AckFunc does nothing); the broker
// requeues it, and a new Source on the queue gets it again.
func TestSourceConnectionLost(t *testing.T) {
	var c cutter
	key := conntest.Unique() + ".void"
	var cfg Config
	src, rec, queue := durableSource(t, key, func(c2 *Config) { c2.dialed = c.dialed; cfg = *c2 })
	_, ch := directChannel(t)
	ctx := testCtx(t)

	publish(t, ch, key, "one")
	m, oldAck, err := src.Read(ctx)
	if err != nil || string(m.Payload) != "one" {
		t.Fatalf("first read: %v %v", m, err)
	}
	c.cut()
	_, _, err = src.Read(ctx)
	wantFailure(t, err, "ConnectionLost")
	if rec.count(reason("ConnectionLost")) == 0 {
		t.Fatalf("the loss was not reported: %s", rec)
	}
	if _, _, err := src.Read(ctx); err == nil {
		t.Fatal("Read succeeded on a lost Source")
	}

	cfg.dialed = nil
	next := startSource(t, cfg, key)
	m2, ack2, err := next.Read(ctx)
	if err != nil || string(m2.Payload) != "one" {
		t.Fatalf("redelivery: %v %v", m2, err)
	}
	// The old AckFunc must not settle anything: the message is the new
	// Source's now, and stays unsettled.
	oldAck(nil)
	closeSource(t, src)
	closeSource(t, next)
	_ = ack2 // deliberately never settled: the broker requeues it on close
	waitFor(t, "the unsettled redelivery back in the queue", func() bool { return queueDepth(t, ch, queue) == 1 })
}

// TestSourceBrokerClosesConnection: RabbitMQ closing the connection
// (connection.close 320 CONNECTION_FORCED, as an operator or a node
// shutdown does) ends the Source with ConnectionLost.
func TestSourceBrokerClosesConnection(t *testing.T) {
	key := conntest.Unique() + ".forced"
	name := "drv-forced-" + conntest.Unique()
	src, _, _ := durableSource(t, key, func(c *Config) { c.ConnectionName = name })
	out, err := exec.Command("rabbitmqctl", "-q", "list_connections", "pid", "client_properties").CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl list_connections: %v\n%s", err, out)
	}
	var pid string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, name) {
			pid = strings.Fields(line)[0]
		}
	}
	if pid == "" {
		t.Fatalf("the Source's connection %s is not listed:\n%s", name, out)
	}
	rabbitmqctl(t, "close_connection", pid, "closed by the driver test")
	_, _, err = src.Read(testCtx(t))
	f := wantFailure(t, err, "ConnectionLost")
	if !strings.Contains(f.Error(), "closed by the driver test") {
		t.Errorf("the broker's reason is not in the failure: %v", f)
	}
}

func TestSourceNackRequeues(t *testing.T) {
	key := conntest.Unique() + ".nack"
	src, _, queue := durableSource(t, key, nil)
	checkNackRequeues(t, src, key, queue)
}

// roundTrip publishes payload for key and expects src to deliver it, then
// acknowledges it.
func roundTrip(t *testing.T, src *Source, ch *amqp.Channel, key, payload string) {
	t.Helper()
	publish(t, ch, key, payload)
	m, ack, err := src.Read(testCtx(t))
	if err != nil || string(m.Payload) != payload {
		t.Fatalf("Read = %v, %v; want %q", m, err, payload)
	}
	ack(nil)
}

// checkNackRequeues publishes one message for key, nacks it, and expects
// it delivered again and then, acknowledged, gone from queue.
func checkNackRequeues(t *testing.T, src *Source, key, queue string) {
	t.Helper()
	_, ch := directChannel(t)
	ctx := testCtx(t)
	publish(t, ch, key, "again")
	_, ack, err := src.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ack(errors.New("weida hand-off failed"))
	m, ack2, err := src.Read(ctx)
	if err != nil || string(m.Payload) != "again" {
		t.Fatalf("after nack: %v %v", m, err)
	}
	ack2(nil)
	waitFor(t, "an empty queue", func() bool { return queueDepth(t, ch, queue) == 0 })
}

// TestSourceQuorumQueue: a resource may consume a quorum queue, which
// RabbitMQ declares only with its type argument; a nack requeues there too.
func TestSourceQuorumQueue(t *testing.T) {
	key := conntest.Unique() + ".quorum"
	src, _, queue := durableSource(t, key, func(c *Config) { c.Queue.Quorum = true })
	out, err := exec.Command("rabbitmqctl", "-q", "list_queues", "name", "type").CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl list_queues: %v\n%s", err, out)
	}
	if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(queue) + `\s+quorum\s*$`).Match(out) {
		t.Fatalf("queue %s is not a quorum queue:\n%s", queue, out)
	}
	checkNackRequeues(t, src, key, queue)
}

// TestSourcePassiveQueue: a queue an operator declared with arguments of
// its own (here a length limit) cannot be declared again without them;
// passive uses it as it is.
func TestSourcePassiveQueue(t *testing.T) {
	requireBroker(t)
	_, ch := directChannel(t)
	name := "drv-" + conntest.Unique()
	if _, err := ch.QueueDeclare(name, true, false, false, false, amqp.Table{"x-max-length": int32(1000)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteQueue(t, name) })
	key := name + ".passive"
	src, _, _ := durableSource(t, key, func(c *Config) {
		c.Queue = Queue{Name: name, Passive: true}
	})
	roundTrip(t, src, ch, key, "p1")
}

// TestSourcePrefetchBound: with prefetch 3 and nothing settled, the broker
// delivers three messages and keeps the rest.
func TestSourcePrefetchBound(t *testing.T) {
	key := conntest.Unique() + ".prefetch"
	src, _, queue := durableSource(t, key, func(cfg *Config) { cfg.Prefetch = 3 })
	_, ch := directChannel(t)
	for i := range 10 {
		publish(t, ch, key, fmt.Sprint(i))
	}
	ctx := testCtx(t)
	var acks []connectors.AckFunc
	for range 3 {
		_, ack, err := src.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		acks = append(acks, ack)
	}
	waitFor(t, "seven messages held back", func() bool { return queueDepth(t, ch, queue) == 7 })
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if m, _, err := src.Read(short); err == nil {
		t.Fatalf("a fourth delivery %q arrived with three unsettled and prefetch 3", m.Payload)
	}
	for _, a := range acks {
		a(nil)
	}
	for range 7 {
		_, ack, err := src.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ack(nil)
	}
}

// TestSourceQueueDeleted: the broker cancels the consumer of a deleted
// queue; Read fails with ConsumerMissing, and a new Source declares, binds
// and consumes again.
func TestSourceQueueDeleted(t *testing.T) {
	key := conntest.Unique() + ".deleted"
	var cfg Config
	src, rec, queue := durableSource(t, key, func(c *Config) { cfg = *c })
	_, ch := directChannel(t)
	if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
		t.Fatal(err)
	}
	_, _, err := src.Read(testCtx(t))
	wantFailure(t, err, "ConsumerMissing")
	if rec.count(reason("ConsumerMissing")) == 0 {
		t.Fatalf("the cancellation was not reported: %s", rec)
	}
	next := startSource(t, cfg, key)
	roundTrip(t, next, ch, key, "after")
}

// TestSourceDeclareRefused: a queue that exists with other properties is
// refused by the broker: Start fails with DeclarationRefused and the
// broker's reply; once the conflict is gone, a new Source starts.
func TestSourceDeclareRefused(t *testing.T) {
	requireBroker(t)
	_, ch := directChannel(t)
	name := "drv-" + conntest.Unique()
	if _, err := ch.QueueDeclare(name, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteQueue(t, name) })
	cfg := testConfig(name, "")
	cfg.Queue = Queue{Name: name, Durable: true}
	rec := &recorder{}
	src, err := NewSource(cfg, rec.report)
	if err != nil {
		t.Fatal(err)
	}
	defer closeSource(t, src)
	err = src.Start(testCtx(t), []string{"x.#"})
	wantFailure(t, err, "DeclarationRefused")
	if !strings.Contains(err.Error(), "PRECONDITION_FAILED") || !strings.Contains(rec.String(), "PRECONDITION_FAILED") {
		t.Fatalf("the broker's reply is not in the error and the report: %v / %s", err, rec)
	}
	if _, err := ch.QueueDelete(name, false, false, false); err != nil {
		t.Fatal(err)
	}
	startSource(t, cfg, "x.#")
}

// TestPassiveMissing: a passive exchange or queue that does not exist
// (404 NOT_FOUND) fails Start with DeclarationRefused, for a Source and a
// Sink.
func TestPassiveMissing(t *testing.T) {
	requireBroker(t)
	missing := "weida-missing-" + conntest.Unique()
	for name, mod := range map[string]func(*Config){
		"exchange": func(c *Config) { c.Exchange, c.ExchangePassive = missing, true },
		"queue":    func(c *Config) { c.Queue = Queue{Name: missing, Passive: true} },
	} {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig("passive-"+name, "")
			mod(&cfg)
			src, err := NewSource(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer closeSource(t, src)
			err = src.Start(testCtx(t), []string{"a.b"})
			wantFailure(t, err, "DeclarationRefused")
			if !strings.Contains(err.Error(), "NOT_FOUND") {
				t.Errorf("Source: the broker's reply is not in the error: %v", err)
			}
			if name == "queue" {
				return
			}
			sink, err := NewSink(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer closeSink(t, sink)
			wantFailure(t, sink.Start(testCtx(t)), "DeclarationRefused")
		})
	}
}

// TestExchangePassive: an existing exchange declared with properties the
// driver would not declare (transient and auto-delete: declaring it durable
// fails with 406) is used as it is when passive.
func TestExchangePassive(t *testing.T) {
	requireBroker(t)
	_, ch := directChannel(t)
	ex := "weida-passive-" + conntest.Unique()
	if err := ch.ExchangeDeclare(ex, amqp.ExchangeTopic, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.ExchangeDelete(ex, false, false) })
	src, _, _ := durableSource(t, "p.*", func(c *Config) { c.Exchange, c.ExchangePassive = ex, true })
	cfg := testConfig("passive-out", "")
	cfg.Exchange, cfg.ExchangePassive = ex, true
	sink, err := NewSink(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeSink(t, sink)
	ctx := testCtx(t)
	if err := sink.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sink.Write(ctx, &connectors.Message{Topic: "p.q", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	m, ack, err := src.Read(ctx)
	if err != nil || m.Topic != "p.q" {
		t.Fatalf("%v %v", m, err)
	}
	ack(nil)
}

func TestSourceStartCancelled(t *testing.T) {
	cfg := testConfig("unreachable", "")
	cfg.Port = 1
	src, err := NewSource(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	wantFailure(t, src.Start(ctx, []string{"a"}), "BrokerUnreachable")
	if err := src.Start(context.Background(), []string{"a"}); err == nil {
		t.Fatal("second Start succeeded")
	}
	closeSource(t, src)
	if _, _, err := src.Read(context.Background()); err != connectors.ErrClosed {
		t.Fatalf("Read after Close = %v", err)
	}
}

// TestStartAbortedByClose: Close ends a Start still connecting (here to an
// address that never answers the handshake).
func TestStartAbortedByClose(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cfg := testConfig("silent", "")
	cfg.Port = l.Addr().(*net.TCPAddr).Port
	src, err := NewSource(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan error, 1)
	go func() { started <- src.Start(testCtx(t), []string{"a"}) }()
	conn, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	closeSource(t, src)
	if err := <-started; !errors.Is(err, connectors.ErrClosed) {
		t.Fatalf("Start = %v, want ErrClosed", err)
	}
}

func TestSourceServerNamedQueue(t *testing.T) {
	requireBroker(t)
	key := conntest.Unique() + ".anon"
	rec := &recorder{}
	src, err := NewSource(testConfig("anon", ""), rec.report)
	if err != nil {
		t.Fatal(err)
	}
	defer closeSource(t, src)
	if err := src.Start(testCtx(t), []string{key}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(rec.String(), "server-named exclusive queue \"amq.gen-") {
		t.Fatalf("state does not name the server-named queue: %s", rec)
	}
	_, ch := directChannel(t)
	roundTrip(t, src, ch, key, "hi")
}

// TestSinkConfirmsAndReturns: many concurrent Writes, half of them to a
// routing key no queue is bound for; each Write learns its own outcome.
func TestSinkConfirmsAndReturns(t *testing.T) {
	requireBroker(t)
	prefix := conntest.Unique()
	_, ch := directChannel(t)
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q.Name, prefix+".routed", DefaultExchange, false, nil); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	sink, err := NewSink(testConfig("confirms", ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeSink(t, sink)
	ctx := testCtx(t)
	if err := sink.Start(ctx); err != nil {
		t.Fatal(err)
	}
	const n = 400
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := prefix + ".routed"
			if i%2 == 1 {
				key = prefix + ".nowhere"
			}
			errs[i] = sink.Write(ctx, &connectors.Message{Topic: key, Payload: []byte(fmt.Sprint(i))})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		var u connectors.Unroutable
		isU := errors.As(err, &u) && u.Unroutable()
		if i%2 == 0 && err != nil {
			t.Errorf("write %d (routed): %v", i, err)
		}
		if i%2 == 1 && !isU {
			t.Errorf("write %d (unroutable) = %v, want an Unroutable error", i, err)
		}
	}
	got := map[string]bool{}
	for len(got) < n/2 {
		select {
		case d := <-deliveries:
			got[string(d.Body)] = true
		case <-ctx.Done():
			t.Fatalf("received %d of %d routed messages", len(got), n/2)
		}
	}
}

func TestSinkNotConnected(t *testing.T) {
	cfg := testConfig("down", "")
	cfg.Port = 1
	sink, err := NewSink(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := sink.Start(testCtx(t)); err == nil {
		t.Fatal("Start succeeded against a closed port")
	}
	if err := sink.Write(context.Background(), &connectors.Message{Topic: "a"}); !errors.Is(err, connectors.ErrNotConnected) {
		t.Fatalf("Write without a connection = %v, want ErrNotConnected", err)
	}
	closeSink(t, sink)
	if err := sink.Write(context.Background(), &connectors.Message{Topic: "a"}); err != connectors.ErrClosed {
		t.Fatalf("Write after Close = %v, want ErrClosed", err)
	}
}

// TestSinkConnectionLost: after the network connection is cut, the Sink
// does not reconnect: Writes, those waiting for a confirm included, fail
// with ConnectionLost; a new Sink publishes again.
func TestSinkConnectionLost(t *testing.T) {
	requireBroker(t)
	var c cutter
	cfg := testConfig("lost", "")
	cfg.dialed = c.dialed
	rec := &recorder{}
	sink, err := NewSink(cfg, rec.report)
	if err != nil {
		t.Fatal(err)
	}
	defer closeSink(t, sink)
	ctx := testCtx(t)
	if err := sink.Start(ctx); err != nil {
		t.Fatal(err)
	}
	_, ch := directChannel(t)
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	key := conntest.Unique() + ".re"
	if err := ch.QueueBind(q.Name, key, DefaultExchange, false, nil); err != nil {
		t.Fatal(err)
	}
	// Writes under way while the connection breaks end with a failure
	// or, when their confirm arrived first, succeed; none may hang or
	// report ErrNotConnected.
	const n = 50
	errs := make(chan error, n)
	for range n {
		go func() { errs <- sink.Write(ctx, &connectors.Message{Topic: key, Payload: []byte("x")}) }()
	}
	c.cut()
	for range n {
		if err := <-errs; err != nil {
			wantFailure(t, err, "ConnectionLost")
		}
	}
	wantFailure(t, sink.Write(ctx, &connectors.Message{Topic: key, Payload: []byte("x")}), "ConnectionLost")
	if rec.count(reason("ConnectionLost")) == 0 {
		t.Fatalf("the loss was not reported: %s", rec)
	}
	closeSink(t, sink)

	cfg.dialed = nil
	next, err := NewSink(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeSink(t, next)
	if err := next.Start(ctx); err != nil {
		t.Fatal(err)
	}
	before := queueDepth(t, ch, q.Name)
	if err := next.Write(ctx, &connectors.Message{Topic: key, Payload: []byte("y")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the message in the queue", func() bool { return queueDepth(t, ch, q.Name) == before+1 })
}

// TestSinkRefusedExchange: an exchange of another type is refused by the
// broker: Start fails with DeclarationRefused and the broker's reply.
func TestSinkRefusedExchange(t *testing.T) {
	requireBroker(t)
	cfg := testConfig("direct", "")
	cfg.Exchange = "amq.direct"
	rec := &recorder{}
	sink, err := NewSink(cfg, rec.report)
	if err != nil {
		t.Fatal(err)
	}
	defer closeSink(t, sink)
	err = sink.Start(testCtx(t))
	wantFailure(t, err, "DeclarationRefused")
	if !strings.Contains(err.Error(), "inequivalent arg 'type'") || rec.count(reason("DeclarationRefused")) == 0 {
		t.Fatalf("the broker's reply is not in the error or not reported: %v / %s", err, rec)
	}
}

// TestCustomExchange: a custom exchange is declared durable topic and used
// by both sides.
func TestCustomExchange(t *testing.T) {
	requireBroker(t)
	ex := "weida-test-" + conntest.Unique()
	_, ch := directChannel(t)
	t.Cleanup(func() { ch.ExchangeDelete(ex, false, false) })
	key := "orders.eu.new"
	src, _, _ := durableSource(t, "orders.*.new.#", func(cfg *Config) { cfg.Exchange = ex })
	sink, err := NewSink(Config{Host: loopback, Port: brokerPort, Exchange: ex}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeSink(t, sink)
	ctx := testCtx(t)
	if err := sink.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sink.Write(ctx, &connectors.Message{Topic: key, Payload: []byte("o")}); err != nil {
		t.Fatal(err)
	}
	m, ack, err := src.Read(ctx)
	if err != nil || m.Topic != key {
		t.Fatalf("%v %v", m, err)
	}
	ack(nil)
	if err := ch.ExchangeDeclarePassive(ex, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		t.Fatalf("the exchange is missing: %v", err)
	}
}

// TestMetadataRoundTrip: what a Sink writes, a Source reads back: content
// type, trace context and payload unchanged, and the loop mark exactly when
// both use the same non-empty marker.
func TestMetadataRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := &connectors.Message{
			Topic:       rapid.String().Draw(t, "topic"),
			Payload:     rapid.SliceOf(rapid.Byte()).Draw(t, "payload"),
			ContentType: rapid.String().Draw(t, "contentType"),
			Traceparent: rapid.String().Draw(t, "traceparent"),
			Tracestate:  rapid.String().Draw(t, "tracestate"),
		}
		out := rapid.SampledFrom([]string{"", "a", "b"}).Draw(t, "sinkMarker")
		in := rapid.SampledFrom([]string{"", "a", "b"}).Draw(t, "sourceMarker")
		seq := rapid.Uint64Range(1, 1<<40).Draw(t, "seq")
		sink := &Sink{cfg: Config{LoopMarker: out}}
		p := sink.publishing(m, seq)
		if err := p.Headers.Validate(); err != nil {
			t.Fatalf("invalid headers: %v", err)
		}
		if p.DeliveryMode != amqp.Persistent {
			t.Fatalf("delivery mode %d", p.DeliveryMode)
		}
		if got, _ := p.Headers[SeqHeader].(int64); uint64(got) != seq {
			t.Fatalf("sequence header %v, want %d", p.Headers[SeqHeader], seq)
		}
		src := &Source{cfg: Config{LoopMarker: in}}
		got := src.message(&amqp.Delivery{RoutingKey: m.Topic, Body: p.Body, ContentType: p.ContentType, Headers: p.Headers})
		if got.Topic != m.Topic || string(got.Payload) != string(m.Payload) || got.ContentType != m.ContentType ||
			got.Traceparent != m.Traceparent || got.Tracestate != m.Tracestate {
			t.Fatalf("round trip changed the message: %+v → %+v", m, got)
		}
		if want := in != "" && in == out; got.Looped != want {
			t.Fatalf("Looped = %v with markers %q → %q", got.Looped, out, in)
		}
	})
}

func TestHeaderString(t *testing.T) {
	h := amqp.Table{"s": "text", "b": []byte("bytes"), "i": int32(7), "n": nil}
	for key, want := range map[string]string{"s": "text", "b": "bytes", "i": "", "n": "", "missing": ""} {
		if got := headerString(h, key); got != want {
			t.Errorf("headerString(%q) = %q, want %q", key, got, want)
		}
	}
	if got := headerString(nil, "s"); got != "" {
		t.Errorf("nil table: %q", got)
	}
}

// TestWrongCredentials: the broker refuses the login: Start fails with
// CredentialsRefused, the password appears nowhere, and nothing is left
// behind (goleak checks).
func TestWrongCredentials(t *testing.T) {
	requireBroker(t)
	cfg := testConfig("wrong-password", "")
	cfg.Password = "not-guest"
	rec := &recorder{}
	s, err := NewSink(cfg, rec.report)
	if err != nil {
		t.Fatal(err)
	}
	err = s.Start(testCtx(t))
	wantFailure(t, err, "CredentialsRefused")
	closeSink(t, s)
	if strings.Contains(rec.String(), "not-guest") || strings.Contains(err.Error(), "not-guest") {
		t.Fatalf("a report or the error reveals the password: %s / %v", rec, err)
	}
	src, err := NewSource(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeSource(t, src)
	wantFailure(t, src.Start(testCtx(t), []string{"a"}), "CredentialsRefused")
}

// TestConfigOfAddress: the driver takes the broker's address and virtual
// host from the loaded resource's parsed fields, and names the broker by a
// URL built from them.
func TestConfigOfAddress(t *testing.T) {
	built := &tls.Config{ServerName: "rabbit.example"}
	for _, tc := range []struct {
		name    string
		broker  resources.Broker
		vhost   string
		tls     *tls.Config
		wantTLS bool
		wantURL string
	}{
		{"plain", resources.Broker{Host: "127.0.0.1", Port: 5672}, "/", nil, false, "amqp://127.0.0.1:5672"},
		{"vhost with a slash", resources.Broker{Host: "rabbit.example", Port: 5671, TLS: resources.TLS{Enabled: true}}, "prod/eu", built, true, "amqps://rabbit.example:5671"},
		{"tls without a built config", resources.Broker{Host: "::1", Port: 5671, TLS: resources.TLS{Enabled: true}}, "a b", nil, true, "amqps://[::1]:5671"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.broker.Options = Options{Exchange: DefaultExchange, VHost: tc.vhost}
			cfg := configOf(resources.BrokerConfig{Resource: &resources.Connector{Broker: tc.broker}, TLS: tc.tls})
			if cfg.Host != tc.broker.Host || cfg.Port != tc.broker.Port || cfg.VHost != tc.vhost {
				t.Errorf("address %s:%d vhost %q, want %s:%d vhost %q", cfg.Host, cfg.Port, cfg.VHost, tc.broker.Host, tc.broker.Port, tc.vhost)
			}
			if (cfg.TLS != nil) != tc.wantTLS {
				t.Errorf("TLS %v, want TLS %v", cfg.TLS, tc.wantTLS)
			}
			if tc.tls != nil && cfg.TLS != tc.tls {
				t.Error("the TLS configuration built for the resource is not the one used")
			}
			if got := cfg.brokerURL(); got != tc.wantURL {
				t.Errorf("broker URL %s, want %s", got, tc.wantURL)
			}
		})
	}
}

// TestBrokerURLDefaultPort: a zero Port is the scheme's default.
func TestBrokerURLDefaultPort(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Host: "h"}, "amqp://h:5672"},
		{Config{Host: "h", TLS: &tls.Config{}}, "amqps://h:5671"},
		{Config{Host: "h", Port: 6000}, "amqp://h:6000"},
	} {
		if got := tc.cfg.brokerURL(); got != tc.want {
			t.Errorf("%s:%d TLS %v: %s, want %s", tc.cfg.Host, tc.cfg.Port, tc.cfg.TLS != nil, got, tc.want)
		}
	}
}

// TestVHostReachesBroker: the virtual host is opened as written, a '/'
// in it included: the default one connects, a missing one is refused by
// the broker as PermissionDenied.
func TestVHostReachesBroker(t *testing.T) {
	requireBroker(t)
	cfg := testConfig("vhost-default", "")
	cfg.VHost = "/"
	ok, err := NewSink(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeSink(t, ok)
	if err := ok.Start(testCtx(t)); err != nil {
		t.Fatalf("the default virtual host, named: %v", err)
	}

	cfg = testConfig("vhost-missing", "")
	cfg.VHost = "missing/" + conntest.Unique()
	s, err := NewSink(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeSink(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = s.Start(ctx)
	wantFailure(t, err, "PermissionDenied")
	// RabbitMQ's reason text is the only place that says which virtual
	// host it was asked for: it must be the one written, unescaped.
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.NotAllowed || !strings.Contains(ae.Reason, cfg.VHost) {
		t.Errorf("Start's error is not the broker refusing virtual host %q: %v", cfg.VHost, err)
	}
}
