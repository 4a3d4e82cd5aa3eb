package nats

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"weida.dev/connector/connectors"
	"weida.dev/connector/connectors/conntest"
)

const natsServerBin = "/usr/sbin/nats-server"

func freePort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// privateServer is a nats-server process of one test, which the test may
// kill and start again on the same port and store.
type privateServer struct {
	t    testing.TB
	port string
	dir  string
	args []string // after the listen address, port and store
	cmd  *exec.Cmd
	done chan struct{}
}

func startPrivateServer(t testing.TB, extraArgs ...string) *privateServer {
	t.Helper()
	if _, err := exec.LookPath(natsServerBin); err != nil {
		t.Skipf("%s is not installed", natsServerBin)
	}
	s := &privateServer{t: t, port: freePort(t), dir: t.TempDir(), args: extraArgs}
	s.start()
	t.Cleanup(s.kill)
	return s
}

func (s *privateServer) URL() string { return "nats://127.0.0.1:" + s.port }

// Port returns the server's client port.
func (s *privateServer) Port() int { return portNumber(s.t, s.port) }

// portNumber returns port, a decimal port number, as an int.
func portNumber(t testing.TB, port string) int {
	t.Helper()
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (s *privateServer) start() {
	s.t.Helper()
	s.cmd = exec.Command(natsServerBin, append([]string{"-a", "127.0.0.1", "-p", s.port, "-js", "-sd", s.dir}, s.args...)...)
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { cmd.Wait(); close(done) }(s.cmd, s.done)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+s.port, time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("private nats-server on %s did not start: %v", s.port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill stops the server abruptly, as a crash would.
func (s *privateServer) kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

// states records what a driver reports.
type states struct {
	mu  sync.Mutex
	all []connectors.ConnState
}

func (s *states) report(c connectors.ConnState) {
	s.mu.Lock()
	s.all = append(s.all, c)
	s.mu.Unlock()
}

func (s *states) last() connectors.ConnState {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.all) == 0 {
		return connectors.ConnState{}
	}
	return s.all[len(s.all)-1]
}

func (s *states) seen(reason string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.all {
		if c.Reason == reason {
			return true
		}
	}
	return false
}

func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestReconnect: after the server dies and comes back, the Source's
// subscription and the Sink's publishing work again without any call from
// the runtime, the state changes are reported, and Write fails with
// ErrNotConnected while the server is away.
func TestReconnect(t *testing.T) {
	srv := startPrivateServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	backoff := func(int) time.Duration { return 50 * time.Millisecond }

	var srcStates, sinkStates states
	src, err := NewSource(Config{Host: loopback, Port: srv.Port(), Name: "src", Backoff: backoff}, srcStates.report)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close(context.Background())
	if err := src.Start(ctx, []string{"re.*"}); err != nil {
		t.Fatal(err)
	}
	sink, err := NewSink(Config{Host: loopback, Port: srv.Port(), Name: "sink", Backoff: backoff}, sinkStates.report)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close(context.Background())
	if err := sink.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if !srcStates.last().Up || !sinkStates.last().Up {
		t.Fatalf("not up after Start: %+v %+v", srcStates.last(), sinkStates.last())
	}
	roundTrip := func(payload string) {
		t.Helper()
		if err := sink.Write(ctx, &connectors.Message{Topic: "re.x", Payload: []byte(payload)}); err != nil {
			t.Fatalf("Write: %v", err)
		}
		m, _, err := src.Read(ctx)
		if err != nil || string(m.Payload) != payload {
			t.Fatalf("Read = %v, %v; want %q", m, err, payload)
		}
	}
	roundTrip("before")

	srv.kill()
	eventually(t, 10*time.Second, "both sides to report the loss", func() bool {
		return !srcStates.last().Up && !sinkStates.last().Up
	})
	err = sink.Write(ctx, &connectors.Message{Topic: "re.x", Payload: []byte("while down")})
	if !errors.Is(err, connectors.ErrNotConnected) {
		t.Fatalf("Write while down = %v, want ErrNotConnected", err)
	}
	if err := writeAsync(ctx, sink, &connectors.Message{Topic: "re.x", Payload: []byte("while down")}); !errors.Is(err, connectors.ErrNotConnected) {
		t.Fatalf("WriteAsync while down = %v, want ErrNotConnected", err)
	}

	srv.start()
	eventually(t, 20*time.Second, "both sides to reconnect", func() bool {
		return srcStates.last().Up && sinkStates.last().Up
	})
	// The source's subscription is back once the restarted server has
	// processed the SUB nats.go resends on reconnecting, which can come
	// after the sink's first publish on a busy machine; core NATS keeps
	// nothing for a subject nobody subscribes to. So publish until one
	// arrives (CI once waited the whole minute for a single one).
	for deadline := time.Now().Add(20 * time.Second); ; {
		if err := sink.Write(ctx, &connectors.Message{Topic: "re.x", Payload: []byte("after")}); err != nil {
			t.Fatalf("Write after the reconnect: %v", err)
		}
		rctx, rcancel := context.WithTimeout(ctx, 500*time.Millisecond)
		m, _, err := src.Read(rctx)
		rcancel()
		if err == nil {
			if string(m.Payload) != "after" {
				t.Fatalf("Read after the reconnect = %q; want \"after\"", m.Payload)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing read 20 s after the reconnect: %v", err)
		}
	}
	if !srcStates.seen("ConnectionLost") || !sinkStates.seen("ConnectionLost") {
		t.Errorf("ConnectionLost not reported: %+v / %+v", srcStates.all, sinkStates.all)
	}
}

// TestSlowConsumerCounted: messages nats.go drops because the bridge does
// not read are counted, reported to OnDrop and logged, so that what was
// read plus what was dropped is what was published.
func TestSlowConsumerCounted(t *testing.T) {
	requireServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	subject := "slow." + conntest.Unique()
	var mu sync.Mutex
	onDrop := map[string]int{}
	src, err := NewSource(Config{
		Host: loopback, Port: serverPort, PendingMessages: 10,
		OnDrop: func(filter, reason string, n int) {
			mu.Lock()
			onDrop[filter+" "+reason] += n
			mu.Unlock()
		},
	}, func(connectors.ConnState) {})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close(context.Background())
	if err := src.Start(ctx, []string{subject}); err != nil {
		t.Fatal(err)
	}
	const sent = 2000
	nc := dial(t)
	defer nc.Close()
	for i := range sent {
		if err := nc.Publish(subject, []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.FlushWithContext(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "drops to be counted", func() bool { return src.Dropped() > 0 })
	read := 0
	eventually(t, 20*time.Second, "read + dropped to equal sent", func() bool {
		for {
			rctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			_, ack, err := src.Read(rctx)
			cancel()
			if err != nil {
				break
			}
			ack(nil)
			read++
		}
		return read+int(src.Dropped()) == sent
	})
	mu.Lock()
	defer mu.Unlock()
	key := subject + " " + connectors.ReasonBrokerDropped
	if uint64(onDrop[key]) != src.Dropped() {
		t.Fatalf("OnDrop saw %v, Dropped() = %d", onDrop, src.Dropped())
	}
	t.Logf("sent %d, read %d, dropped %d", sent, read, src.Dropped())
}

// TestSinkConcurrentWrites: many writers share flush rounds and every
// message they were told was published arrives.
func TestSinkConcurrentWrites(t *testing.T) {
	requireServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	subject := "conc." + conntest.Unique()
	nc := dial(t)
	defer nc.Close()
	got := make(chan *natsgo.Msg, 10000)
	if _, err := nc.ChanSubscribe(subject, got); err != nil {
		t.Fatal(err)
	}
	if err := nc.FlushWithContext(ctx); err != nil {
		t.Fatal(err)
	}
	sink := startSink(t, ctx)
	// Half the writers wait in Write, the other half start every publish
	// with WriteAsync and count the outcomes: both share the rounds.
	const writers, each = 32, 100
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				m := &connectors.Message{Topic: subject, Payload: fmt.Appendf(nil, "%d-%d", w, i)}
				if w%2 == 0 {
					if err := sink.Write(ctx, m); err != nil {
						errs <- err
						return
					}
					continue
				}
				wg.Add(1)
				var once atomic.Int32
				sink.WriteAsync(m, func(err error) {
					if once.Add(1) != 1 {
						errs <- errors.New("WriteAsync called done twice")
					}
					if err != nil {
						errs <- err
					}
					wg.Done()
				})
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if st := sink.Stats(); st.Confirmed != writers*each {
		t.Errorf("Stats().Confirmed = %d, want %d", st.Confirmed, writers*each)
	}
	// Every Write returned after a PONG that followed its publish, and the
	// server sends the PONG after it routed the publish: a PING of our own
	// after that proves the deliveries are in.
	if err := nc.FlushWithContext(ctx); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for len(got) > 0 {
		seen[string((<-got).Data)] = true
	}
	if len(seen) != writers*each {
		t.Fatalf("received %d distinct messages, want %d", len(seen), writers*each)
	}
	if err := sink.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sink.Write(ctx, &connectors.Message{Topic: subject}); !errors.Is(err, connectors.ErrClosed) {
		t.Fatalf("Write after Close = %v, want ErrClosed", err)
	}
	if err := writeAsync(ctx, sink, &connectors.Message{Topic: subject}); !errors.Is(err, connectors.ErrClosed) {
		t.Fatalf("WriteAsync after Close = %v, want ErrClosed", err)
	}
}

// writeAsync calls WriteAsync and waits for its outcome.
func writeAsync(ctx context.Context, sink *Sink, m *connectors.Message) error {
	done := make(chan error, 1)
	sink.WriteAsync(m, func(err error) { done <- err })
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestQueueGroupSplits: two Sources in one queue group share the messages:
// each message reaches exactly one of them.
func TestQueueGroupSplits(t *testing.T) {
	requireServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	subject := "qg." + conntest.Unique()
	var srcs [2]*Source
	for i := range srcs {
		src, err := NewSource(Config{Host: loopback, Port: serverPort, QueueGroup: "g-" + subject}, func(connectors.ConnState) {})
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close(context.Background())
		if err := src.Start(ctx, []string{subject}); err != nil {
			t.Fatal(err)
		}
		srcs[i] = src
	}
	const sent = 200
	nc := dial(t)
	defer nc.Close()
	for i := range sent {
		if err := nc.Publish(subject, []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.FlushWithContext(ctx); err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	var per [2]int
	for len(seen) < sent {
		progress := false
		for i, src := range srcs {
			rctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			m, ack, err := src.Read(rctx)
			cancel()
			if err != nil {
				continue
			}
			ack(nil)
			seen[string(m.Payload)]++
			per[i]++
			progress = true
		}
		if !progress && ctx.Err() != nil {
			t.Fatalf("received %d of %d", len(seen), sent)
		}
	}
	for p, k := range seen {
		if k != 1 {
			t.Errorf("message %s received %d times", p, k)
		}
	}
	if per[0] == 0 || per[1] == 0 {
		t.Errorf("one member got nothing: %v", per)
	}
	t.Logf("split %v", per)
}

// TestSinkRejectsOverMaxPayload: a message over the server's max_payload is
// rejected for good (the runtime counts it as too-large at once) by both
// Write and WriteAsync, and the connection stays usable.
func TestSinkRejectsOverMaxPayload(t *testing.T) {
	requireServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sink := startSink(t, ctx)
	subject := "big." + conntest.Unique()
	sink.mu.Lock()
	maxPayload := sink.nc.MaxPayload()
	sink.mu.Unlock()
	big := &connectors.Message{Topic: subject, Payload: make([]byte, maxPayload+1)}
	for name, write := range map[string]func() error{
		"Write":      func() error { return sink.Write(ctx, big) },
		"WriteAsync": func() error { return writeAsync(ctx, sink, big) },
	} {
		var rj connectors.Rejected
		if err := write(); !errors.As(err, &rj) || rj.RejectReason() != connectors.ReasonTooLarge {
			t.Errorf("%s of %d bytes = %v, want a rejection as %s", name, len(big.Payload), err, connectors.ReasonTooLarge)
		}
	}
	if err := sink.Write(ctx, &connectors.Message{Topic: subject, Payload: []byte("small")}); err != nil {
		t.Fatalf("Write after the rejections: %v", err)
	}
}

// startSink starts a core Sink on the shared server, closed when the test
// ends.
func startSink(t *testing.T, ctx context.Context) *Sink {
	t.Helper()
	sink, err := NewSink(Config{Host: loopback, Port: serverPort}, func(connectors.ConnState) {})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close(context.Background()) })
	if err := sink.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return sink
}

// TestSinkRejectsDeniedPublish: nats-server drops a publish its permissions
// refuse and says so only asynchronously (-ERR before the round trip's
// PONG). The Sink attributes each refusal to its message, which the runtime
// then counts as publish-denied, while the other messages of the same
// rounds are confirmed.
func TestSinkRejectsDeniedPublish(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "nats.conf")
	err := os.WriteFile(conf, []byte(`authorization {
  users = [
    {user: bridge, password: pw, permissions: {publish: {deny: ["denied.>"]}, subscribe: ">"}}
  ]
}
`), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	srv := startPrivateServer(t, "-c", conf)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sink, err := NewSink(Config{Host: loopback, Port: srv.Port(), User: "bridge", Password: "pw"}, func(connectors.ConnState) {})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close(context.Background())
	if err := sink.Start(ctx); err != nil {
		t.Fatal(err)
	}
	nc, err := natsgo.Connect(srv.URL(), natsgo.UserInfo("bridge", "pw"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	got, err := nc.SubscribeSync("allowed.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.FlushWithContext(ctx); err != nil {
		t.Fatal(err)
	}

	// Allowed and denied messages interleaved, many at once so that
	// rounds hold both kinds; Write and WriteAsync alike.
	const n = 200
	outcomes := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		subject := fmt.Sprintf("allowed.%d", i)
		if i%3 == 0 {
			subject = fmt.Sprintf("denied.%d", i)
		}
		m := &connectors.Message{Topic: subject, Payload: []byte(subject)}
		wg.Add(1)
		if i%2 == 0 {
			go func() { defer wg.Done(); outcomes <- sink.Write(ctx, m) }()
		} else {
			sink.WriteAsync(m, func(err error) { outcomes <- err; wg.Done() })
		}
	}
	wg.Wait()
	close(outcomes)
	denied, confirmed := 0, 0
	for err := range outcomes {
		var rj connectors.Rejected
		switch {
		case err == nil:
			confirmed++
		case errors.As(err, &rj) && rj.RejectReason() == connectors.ReasonPublishDenied:
			denied++
		default:
			t.Errorf("unexpected outcome: %v", err)
		}
	}
	wantDenied := (n + 2) / 3
	if denied != wantDenied || confirmed != n-wantDenied {
		t.Errorf("%d denied, %d confirmed; want %d and %d", denied, confirmed, wantDenied, n-wantDenied)
	}
	for range n - wantDenied {
		if _, err := got.NextMsg(5 * time.Second); err != nil {
			t.Fatalf("an allowed message did not arrive: %v", err)
		}
	}
}
