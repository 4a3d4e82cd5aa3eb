package conntest

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"weida.dev/connector/connectors"
	"weida.dev/connector/internal/brokertest"
)

// private returns the harness's private broker and a harness bound to it,
// or skips the test.
func private(t *testing.T, h Harness) (*brokertest.Broker, Harness) {
	t.Helper()
	b := h.PrivateBroker(t)
	if b == nil {
		t.Skip("the harness has no private broker")
	}
	return b, h.At(t, b.Addr())
}

// testStartWhileUnreachable: units whose broker is not running report why
// and keep trying; once it starts they become Ready by themselves (no
// Apply, no restart) and messages cross.
func testStartWhileUnreachable(t *testing.T, h Harness) {
	b, ph := private(t, h)
	b.Kill()
	filter, selected, _, _ := ph.Topics()
	u := startUnits(t, ph, filter, unitOptions{})
	if h.Capabilities().RetriesInStart {
		u.waitFor("BrokerConnected False with reason "+connectors.FailBrokerUnreachable, 20*time.Second, func() bool {
			u.noPermanent()
			c := condition(u.status(u.in), connectors.CondBrokerConnected)
			return c.Status == "False" && c.Reason == connectors.FailBrokerUnreachable
		})
	} else {
		for _, name := range []string{u.in, u.out} {
			u.waitFor(name+": a second failed attempt with reason "+connectors.FailBrokerUnreachable, 20*time.Second, func() bool {
				u.noPermanent()
				f := u.status(name).Failure
				return f != nil && f.Reason == connectors.FailBrokerUnreachable && f.Attempts >= 2
			})
		}
	}
	b.Start()
	u.waitReady(30 * time.Second)
	u.crossInbound(ph, selected, "after start", 20*time.Second)
	u.crossOutbound(ph, filter, selected, "after start out", 20*time.Second)
}

// testBrokerKilledAndRestarted: Ready units whose broker is killed
// (SIGKILL) and started again on the same port are Ready again by
// themselves, and messages cross both ways.
func testBrokerKilledAndRestarted(t *testing.T, h Harness) {
	b, ph := private(t, h)
	b.Start()
	filter, selected, _, _ := ph.Topics()
	u := startUnits(t, ph, filter, unitOptions{})
	u.waitReady(30 * time.Second)
	u.crossInbound(ph, selected, "before kill", 20*time.Second)
	b.Restart()
	u.waitReady(60 * time.Second)
	u.crossInbound(ph, selected, "after restart", 30*time.Second)
	u.crossOutbound(ph, filter, selected, "after restart out", 30*time.Second)
	u.noPermanent()
}

// testClassification: the driver names its failures, and none that a
// broker or network causes is permanent.
func testClassification(t *testing.T, h Harness) {
	filter, _, _, _ := h.Topics()
	check := func(what string, err error, want string) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s: Start succeeded", what)
		}
		reason, permanent := connectors.Classify(err, connectors.FailStart)
		if permanent {
			t.Errorf("%s: %v classified permanent; a broker or network failure never is", what, err)
		}
		if reason != want {
			t.Errorf("%s: %v classified %s, want %s", what, err, reason, want)
		}
	}
	starts := func(h Harness, d time.Duration) (srcErr, sinkErr error) {
		t.Helper()
		src, err := h.NewSource("class-"+Unique(), "", func(connectors.ConnState) {})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), d)
		srcErr = src.Start(ctx, []string{filter})
		cancel()
		src.Close(context.Background())
		sink, err := h.NewSink("class-"+Unique(), "", func(connectors.ConnState) {})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel = context.WithTimeout(context.Background(), d)
		sinkErr = sink.Start(ctx)
		cancel()
		sink.Close(context.Background())
		return srcErr, sinkErr
	}
	srcErr, sinkErr := starts(h.At(t, closedAddr(t)), 3*time.Second)
	check("Source on a closed port", srcErr, connectors.FailBrokerUnreachable)
	check("Sink on a closed port", sinkErr, connectors.FailBrokerUnreachable)

	if !h.Capabilities().CredentialsRefused {
		return
	}
	rh := h.Refusing(t)
	if rh == nil {
		t.Fatal("Capabilities.CredentialsRefused is set but Refusing returned nil")
	}
	srcErr, sinkErr = starts(rh, 5*time.Second)
	check("Source with refused credentials", srcErr, "CredentialsRefused")
	check("Sink with refused credentials", sinkErr, "CredentialsRefused")
}

// testCancellation: a Start blocked on a broker that never answers returns
// soon after its ctx ends; Close during Start returns; Runtime.Stop
// returns promptly while a unit waits between attempts.
func testCancellation(t *testing.T, h Harness) {
	const prompt = 3 * time.Second
	filter, _, _, _ := h.Topics()
	hole := h.At(t, blackhole(t))

	src, err := hole.NewSource("cancel-"+Unique(), "", func(connectors.ConnState) {})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	begin := time.Now()
	err = src.Start(ctx, []string{filter})
	cancel()
	if err == nil {
		t.Fatal("Start succeeded against a broker that never answers")
	}
	if d := time.Since(begin); d > prompt {
		t.Errorf("Source.Start returned %v after its ctx ended", d-300*time.Millisecond)
	}
	closeWithin(t, "Source after a cancelled Start", src.Close, prompt)

	sink, err := hole.NewSink("cancel-"+Unique(), "", func(connectors.ConnState) {})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	begin = time.Now()
	err = sink.Start(ctx)
	cancel()
	if err == nil {
		t.Fatal("Sink.Start succeeded against a broker that never answers")
	}
	if d := time.Since(begin); d > prompt {
		t.Errorf("Sink.Start returned %v after its ctx ended", d-300*time.Millisecond)
	}
	closeWithin(t, "Sink after a cancelled Start", sink.Close, prompt)

	// Close while Start is blocked: Close returns, and so does Start once
	// its ctx ends.
	src, err = hole.NewSource("cancel-"+Unique(), "", func(connectors.ConnState) {})
	if err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer scancel()
	started := make(chan error, 1)
	go func() { started <- src.Start(sctx, []string{filter}) }()
	time.Sleep(200 * time.Millisecond)
	closeWithin(t, "Source during Start", src.Close, prompt)
	scancel()
	select {
	case <-started:
	case <-time.After(prompt):
		t.Error("Source.Start did not return after Close and the end of its ctx")
		<-started
	}

	// Runtime.Stop while the unit waits out a long backoff.
	u := startUnits(t, h.At(t, closedAddr(t)), filter, unitOptions{
		backoff: func(int) time.Duration { return time.Minute },
	})
	u.waitFor("a failure on record", 20*time.Second, func() bool {
		if h.Capabilities().RetriesInStart {
			return condition(u.status(u.in), connectors.CondBrokerConnected).Status == "False"
		}
		return u.status(u.in).Failure != nil && u.status(u.out).Failure != nil
	})
	begin = time.Now()
	u.stop()
	if d := time.Since(begin); d > prompt {
		t.Errorf("Runtime.Stop took %v during a backoff", d)
	}
}

func closeWithin(t *testing.T, what string, closeFn func(context.Context) error, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = closeFn(ctx)
	}()
	select {
	case <-done:
	case <-time.After(d + time.Second):
		t.Errorf("Close of %s did not return within %v", what, d)
		<-done
	}
}

// testNoGoroutineLeak: after a runtime has bridged both ways and stopped,
// no goroutine of the driver (or of the runtime) is left.
func testNoGoroutineLeak(t *testing.T, h Harness) {
	// Goroutines running before the subtest belong to the test's own
	// infrastructure (other subtests' helpers winding down, the testing
	// package, a harness's direct broker connections): they are not the
	// driver's.
	before := goleak.IgnoreCurrent()
	filter, selected, _, _ := h.Topics()
	func() {
		u := startUnits(t, h, filter, unitOptions{})
		u.waitReady(20 * time.Second)
		u.crossInbound(h, selected, "leak in", 10*time.Second)
		u.crossOutbound(h, filter, selected, "leak out", 10*time.Second)
		u.stop()
	}()
	if err := goleak.Find(before,
		// quic-go keeps one package-level goroutine for its connection ID
		// generator's timer wheel on some platforms; it is not per peer.
		goleak.IgnoreAnyFunction("github.com/quic-go/quic-go.(*Transport).listen"),
	); err != nil {
		t.Fatalf("goroutines left after Runtime.Stop: %v", err)
	}
}

// testAckAfterHandoff: a message the driver gave to Read is acknowledged
// to the broker only through its AckFunc, after the hand-off to weida. The
// test withholds the first message from the runtime (as if the connector
// died before weida took it), stops the unit, and expects the broker to
// deliver it again to the next Source of the resource; a driver that
// acknowledged on read would have lost it.
func testAckAfterHandoff(t *testing.T, h Harness) {
	if !h.Capabilities().Redelivery {
		t.Skip("driver does not redeliver: nothing it reads can be asked for again")
	}
	filter, selected, _, _ := h.Topics()
	name := "ack-" + Unique()
	g := &gate{read: make(chan struct{})}
	u := startUnits(t, h, filter, unitOptions{name: name, noOutbound: true, wrap: g.wrap})
	u.waitReady(20 * time.Second)
	if err := h.Publish(ctxFor(t, 10*time.Second), &connectors.Message{Topic: selected, Payload: []byte("held")}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-g.read:
	case <-time.After(10 * time.Second):
		t.Fatalf("the driver never returned the message from Read; status %+v", u.status(u.in))
	}
	// Time for a driver that acknowledges on read to have done so.
	time.Sleep(300 * time.Millisecond)
	u.stop()

	// The next Source starts only once a weida subscriber is in place:
	// the redelivered message may come first thing, and with no
	// subscriber it would be dropped (on purpose, and acknowledged).
	rec := &ackRecorder{start: make(chan struct{})}
	u2 := startUnits(t, h, filter, unitOptions{name: name, noOutbound: true, wrap: rec.wrap})
	close(rec.start)
	u2.waitReady(20 * time.Second)
	m, ok := receiveWeida(t, u2.sub, h.Capabilities().RedeliverAfter+15*time.Second)
	if !ok || string(m.Payload) != "held" {
		t.Fatalf("the withheld message was not delivered again (got %q, %v): the driver acknowledged it before the hand-off", m.Payload, ok)
	}
	u2.waitFor("the redelivered message acknowledged", 10*time.Second, func() bool { return rec.count() > 0 })
	// The recorder counts the AckFunc when it is called; the bridge counts
	// Bridged before that and Acknowledged only once the AckFunc returned
	// (the driver's ACK sent). Read once right after the recorder's
	// count, the counters can still show the message in flight.
	u2.waitFor("the counters showing it bridged and acknowledged", 10*time.Second, func() bool {
		st := u2.status(u2.in).Counters
		return st.Bridged >= 1 && st.Acknowledged >= 1
	})
}

// gate is a Source wrapper that withholds the first message it reads from
// the runtime: Read keeps it and blocks until its ctx ends.
type gate struct {
	once sync.Once
	read chan struct{} // closed when the first message was read

	mu    sync.Mutex
	ackFn connectors.AckFunc // kept, never called: the message stays unsettled
}

func (g *gate) wrap(s connectors.Source) connectors.Source { return &gatedSource{Source: s, g: g} }

type gatedSource struct {
	connectors.Source
	g *gate
}

func (s *gatedSource) Read(ctx context.Context) (*connectors.Message, connectors.AckFunc, error) {
	m, ack, err := s.Source.Read(ctx)
	if err != nil {
		return m, ack, err
	}
	first := false
	s.g.once.Do(func() { first = true })
	if !first {
		return m, ack, nil
	}
	s.g.mu.Lock()
	s.g.ackFn = ack
	s.g.mu.Unlock()
	close(s.g.read)
	<-ctx.Done()
	return nil, nil, ctx.Err()
}

// ackRecorder is a Source wrapper that counts acknowledgements. Its
// Sources start once start is closed.
type ackRecorder struct {
	start chan struct{}

	mu sync.Mutex
	n  int
}

func (r *ackRecorder) wrap(s connectors.Source) connectors.Source {
	return &recordingSource{Source: s, r: r}
}

func (r *ackRecorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

type recordingSource struct {
	connectors.Source
	r *ackRecorder
}

func (s *recordingSource) Start(ctx context.Context, filters []string) error {
	select {
	case <-s.r.start:
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.Source.Start(ctx, filters)
}

func (s *recordingSource) Read(ctx context.Context) (*connectors.Message, connectors.AckFunc, error) {
	m, ack, err := s.Source.Read(ctx)
	if err != nil {
		return m, ack, err
	}
	return m, func(err error) {
		if err == nil {
			s.r.mu.Lock()
			s.r.n++
			s.r.mu.Unlock()
		}
		ack(err)
	}, nil
}

// condition returns the condition of type typ.
func condition(s connectors.Status, typ string) connectors.Condition {
	for _, c := range s.Conditions {
		if c.Type == typ {
			return c
		}
	}
	return connectors.Condition{}
}
