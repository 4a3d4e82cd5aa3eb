package connectors_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"weida.dev/connector/connectors"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// fakeSource is a Source whose Start and Read fail as its factory says.
// It reports Up once started and delivers nothing: these tests are about
// the runtime's supervision, not about a broker.
type fakeSource struct {
	report   connectors.StateFunc
	startErr error
	readErr  chan error // a value makes Read return it
	closed   chan struct{}
	once     sync.Once
}

func (s *fakeSource) Start(ctx context.Context, _ []string) error {
	if s.startErr == errBlockUntilCancelled {
		// A client library that keeps retrying an unreachable broker
		// inside Start, as autopaho and nats.go do, and says why when
		// its ctx ends.
		<-ctx.Done()
		return connectors.Retryable("CredentialsRefused", fmt.Errorf("not authorized: %w", ctx.Err()))
	}
	if s.startErr != nil {
		return s.startErr
	}
	s.report(connectors.ConnState{Up: true, Reason: "Connected"})
	return nil
}

func (s *fakeSource) Read(ctx context.Context) (*connectors.Message, connectors.AckFunc, error) {
	select {
	case err := <-s.readErr:
		return nil, nil, err
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	case <-s.closed:
		return nil, nil, connectors.ErrClosed
	}
}

func (s *fakeSource) Close(context.Context) error {
	s.once.Do(func() { close(s.closed) })
	return nil
}

// errBlockUntilCancelled makes a fakeSource's Start block until its ctx ends.
var errBlockUntilCancelled = errors.New("block until cancelled")

// sources builds fakeSources; startErr decides the Start error of the
// n-th one (from 1).
type sources struct {
	startErr func(n int) error
	mu       sync.Mutex
	built    []*fakeSource
}

func (f *sources) factory(report connectors.StateFunc) (connectors.Source, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := &fakeSource{report: report, readErr: make(chan error, 1), closed: make(chan struct{})}
	f.built = append(f.built, s)
	if f.startErr != nil {
		s.startErr = f.startErr(len(f.built))
	}
	return s, nil
}

func (f *sources) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.built)
}

func (f *sources) last() *fakeSource {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.built[len(f.built)-1]
}

func inboundUnit(t *testing.T, name, listen string, f *sources) connectors.Unit {
	t.Helper()
	p := policy.NATSTokensV1()
	wf, err := p.ConvertFilter("in.*")
	if err != nil {
		t.Fatal(err)
	}
	return connectors.Unit{
		Spec: connectors.Spec{
			Name: name, Protocol: policy.NATS, Direction: policy.Inbound, Policy: p,
			Routes:   []connectors.Route{{Name: "r", Foreign: "in.*", Weida: wf}},
			Endpoint: "weida://" + listen + "/" + name,
		},
		Revision:  "rev1",
		Listen:    listen,
		Path:      "/" + name,
		NewSource: f.factory,
	}
}

func newRuntime(t *testing.T, backoff func(int) time.Duration) (*connectors.Runtime, *connectors.Metrics) {
	t.Helper()
	m := connectors.NewMetrics(prometheus.NewRegistry())
	rt := connectors.NewRuntime(connectors.Deps{Metrics: m, Backoff: backoff})
	t.Cleanup(rt.Stop)
	return rt, m
}

func statusOf(rt *connectors.Runtime, name string) connectors.Status {
	for _, s := range rt.Statuses() {
		if s.Name == name {
			return s
		}
	}
	return connectors.Status{}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func condition(s connectors.Status, typ string) connectors.Condition {
	for _, c := range s.Conditions {
		if c.Type == typ {
			return c
		}
	}
	return connectors.Condition{}
}

// TestSupervisorRetriesStart: a Source whose Start fails is replaced by a
// fresh one after each failure until one starts; the failures are counted
// by reason, and the unit is Ready once an attempt is up.
func TestSupervisorRetriesStart(t *testing.T) {
	refused := fmt.Errorf("dial tcp: %w", syscall.ECONNREFUSED)
	f := &sources{startErr: func(n int) error {
		if n <= 3 {
			if n == 3 {
				return errors.New("stream not found")
			}
			return refused
		}
		return nil
	}}
	rt, m := newRuntime(t, func(int) time.Duration { return time.Millisecond })
	if err := rt.Apply(context.Background(), []connectors.Unit{inboundUnit(t, "retry", "127.0.0.1:0", f)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the unit to be ready", rt.Ready)
	if got := f.count(); got != 4 {
		t.Errorf("sources built: %d, want 4 (three failed attempts, one that started)", got)
	}
	for i, s := range f.built[:3] {
		select {
		case <-s.closed:
		default:
			t.Errorf("the Source of failed attempt %d was not closed", i+1)
		}
	}
	st := statusOf(rt, "retry")
	if st.Failure != nil {
		t.Errorf("failure still shown after an attempt started: %+v", st.Failure)
	}
	if got := testutil.ToFloat64(m.AttemptsFailed.WithLabelValues("retry", connectors.FailBrokerUnreachable)); got != 2 {
		t.Errorf("attempts_failed_total{reason=BrokerUnreachable} = %v, want 2", got)
	}
	if got := testutil.ToFloat64(m.AttemptsFailed.WithLabelValues("retry", connectors.FailStart)); got != 1 {
		t.Errorf("attempts_failed_total{reason=StartFailed} = %v, want 1", got)
	}
}

// TestSupervisorStartTimeout: a Start that would wait for ever for its
// broker is cut short, so its failure shows with its reason and attempts,
// and the next attempt follows.
func TestSupervisorStartTimeout(t *testing.T) {
	f := &sources{startErr: func(n int) error {
		if n <= 2 {
			return errBlockUntilCancelled
		}
		return nil
	}}
	m := connectors.NewMetrics(prometheus.NewRegistry())
	rt := connectors.NewRuntime(connectors.Deps{Metrics: m, Backoff: func(int) time.Duration { return time.Millisecond },
		StartTimeout: 50 * time.Millisecond})
	t.Cleanup(rt.Stop)
	if err := rt.Apply(context.Background(), []connectors.Unit{inboundUnit(t, "slow", "127.0.0.1:0", f)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the unit to be ready", rt.Ready)
	if got := testutil.ToFloat64(m.AttemptsFailed.WithLabelValues("slow", "CredentialsRefused")); got != 2 {
		t.Errorf("attempts_failed_total{reason=CredentialsRefused} = %v, want 2", got)
	}
}

// TestSupervisorStatusWhileDownAndReload: a Read failure ends the attempt;
// while the unit waits for its next one, /status shows why, and a reload
// with the same configuration tries again at once. A healthy unit with the
// same configuration is left running by a reload. The retried unit keeps
// its counters and series.
func TestSupervisorStatusWhileDownAndReload(t *testing.T) {
	f := &sources{}
	rt, m := newRuntime(t, func(int) time.Duration { return time.Hour })
	units := []connectors.Unit{inboundUnit(t, "down", "127.0.0.1:0", f)}
	if err := rt.Apply(context.Background(), units); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the unit to be ready", rt.Ready)
	f.last().report(connectors.ConnState{Reason: "ConnectionLost"})
	f.last().report(connectors.ConnState{Up: true, Reason: "Connected"})
	f.last().readErr <- connectors.Retryable("StreamGone", errors.New("nats: stream not found"))
	waitFor(t, "the failure", func() bool { return statusOf(rt, "down").Failure != nil })

	st := statusOf(rt, "down")
	fs := st.Failure
	if fs.Reason != "StreamGone" || fs.Message != "nats: stream not found" || fs.Attempts != 1 || fs.Permanent {
		t.Errorf("failure = %+v", fs)
	}
	if d := fs.NextRetryTime.Sub(fs.LastErrorTime); d != time.Hour {
		t.Errorf("next retry %v after the error, want the backoff's 1h", d)
	}
	for _, typ := range []string{connectors.CondReady, connectors.CondBrokerConnected} {
		if c := condition(st, typ); c.Status != "False" || c.Reason != "StreamGone" || c.Message != fs.Message {
			t.Errorf("%s = %+v, want False with the failure's reason and message", typ, c)
		}
	}
	if rt.Ready() {
		t.Error("runtime ready while a unit is down")
	}
	if got := testutil.ToFloat64(m.AttemptsFailed.WithLabelValues("down", "StreamGone")); got != 1 {
		t.Errorf("attempts_failed_total = %v, want 1", got)
	}

	// SIGHUP with nothing changed: the failed unit is tried again now.
	if err := rt.Apply(context.Background(), units); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the unit to be ready again", rt.Ready)
	if got := f.count(); got != 2 {
		t.Errorf("sources built: %d, want 2", got)
	}
	if got := statusOf(rt, "down").Counters.Reconnects; got != 1 {
		t.Errorf("reconnects = %d after the reload, want the count kept", got)
	}
	if got := testutil.ToFloat64(m.AttemptsFailed.WithLabelValues("down", "StreamGone")); got != 1 {
		t.Errorf("attempts_failed_total = %v after the reload, want the series kept", got)
	}
	// And again: now it is healthy, so it is kept.
	if err := rt.Apply(context.Background(), units); err != nil {
		t.Fatal(err)
	}
	if got := f.count(); got != 2 {
		t.Errorf("a reload restarted a healthy, unchanged unit: %d sources built", got)
	}
}

// TestSupervisorCountersSurviveAttempts: the /status counters of a unit
// carry on across its attempts.
func TestSupervisorCountersSurviveAttempts(t *testing.T) {
	f := &sources{}
	rt, _ := newRuntime(t, func(int) time.Duration { return time.Millisecond })
	if err := rt.Apply(context.Background(), []connectors.Unit{inboundUnit(t, "count", "127.0.0.1:0", f)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the unit to be ready", rt.Ready)
	// A lost broker connection, then back: one reconnect.
	f.last().report(connectors.ConnState{Reason: "ConnectionLost"})
	f.last().report(connectors.ConnState{Up: true, Reason: "Connected"})
	if got := statusOf(rt, "count").Counters.Reconnects; got != 1 {
		t.Fatalf("reconnects = %d, want 1", got)
	}
	f.last().readErr <- connectors.ErrClosed // closed without being asked
	waitFor(t, "a second attempt", func() bool { return f.count() == 2 && rt.Ready() })
	if got := statusOf(rt, "count").Counters.Reconnects; got < 1 {
		t.Errorf("reconnects = %d after a new attempt, want the count kept", got)
	}
}

// TestSupervisorPermanent: a permanent failure is not retried and stays
// visible.
func TestSupervisorPermanent(t *testing.T) {
	f := &sources{startErr: func(int) error {
		return connectors.Permanent("AuthenticationFailed", errors.New("nats: authorization violation"))
	}}
	rt, _ := newRuntime(t, func(int) time.Duration { return time.Millisecond })
	_ = rt.Apply(context.Background(), []connectors.Unit{inboundUnit(t, "perm", "127.0.0.1:0", f)})
	waitFor(t, "the failure", func() bool { return statusOf(rt, "perm").Failure != nil })
	fs := statusOf(rt, "perm").Failure
	if !fs.Permanent || fs.Reason != "AuthenticationFailed" || !fs.NextRetryTime.IsZero() {
		t.Errorf("failure = %+v, want permanent with no next retry", fs)
	}
	time.Sleep(50 * time.Millisecond) // many backoffs
	if got := f.count(); got != 1 {
		t.Errorf("a permanent failure was retried: %d sources built", got)
	}
}

// TestSupervisorListenInUse: an inbound unit whose weida port is taken is
// retried, and runs once the port is free.
func TestSupervisorListenInUse(t *testing.T) {
	hold, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := hold.LocalAddr().String()
	f := &sources{}
	rt, m := newRuntime(t, func(int) time.Duration { return 5 * time.Millisecond })
	err = rt.Apply(context.Background(), []connectors.Unit{inboundUnit(t, "busy", addr, f)})
	if err == nil {
		t.Fatal("Apply reported no listen failure")
	}
	st := statusOf(rt, "busy")
	if st.Failure == nil || st.Failure.Reason != connectors.FailListen {
		t.Fatalf("failure = %+v, want %s", st.Failure, connectors.FailListen)
	}
	if c := condition(st, connectors.CondWeidaReady); c.Status != "False" || c.Reason != connectors.FailListen {
		t.Errorf("WeidaReady = %+v, want False, %s", c, connectors.FailListen)
	}
	waitFor(t, "a retried listen", func() bool {
		return testutil.ToFloat64(m.AttemptsFailed.WithLabelValues("busy", connectors.FailListen)) >= 2
	})
	if f.count() != 0 {
		t.Errorf("a Source was built without the weida side: %d", f.count())
	}
	hold.Close()
	waitFor(t, "the unit to run once the port is free", rt.Ready)
	if c := condition(statusOf(rt, "busy"), connectors.CondWeidaReady); c.Status != "True" {
		t.Errorf("WeidaReady = %+v", c)
	}
}

// TestSupervisorJitter: two units failing on the same schedule at the same
// instant are given different retry times.
func TestSupervisorJitter(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	m := connectors.NewMetrics(prometheus.NewRegistry())
	rt := connectors.NewRuntime(connectors.Deps{
		Metrics: m,
		Now:     func() time.Time { return at },
		Backoff: connectors.Backoff{Initial: time.Hour, Max: 10 * time.Hour}.Wait,
	})
	t.Cleanup(rt.Stop)
	var units []connectors.Unit
	for _, name := range []string{"a", "b"} {
		units = append(units, connectors.Unit{
			Spec: connectors.Spec{Name: name, Protocol: policy.NATS, Direction: policy.Outbound, Policy: policy.NATSTokensV1()},
			NewSink: func(connectors.StateFunc) (connectors.Sink, error) {
				return nil, errors.New("no such credentials file")
			},
		})
	}
	if err := rt.Apply(context.Background(), units); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both failures", func() bool {
		return statusOf(rt, "a").Failure != nil && statusOf(rt, "b").Failure != nil
	})
	a, b := statusOf(rt, "a").Failure, statusOf(rt, "b").Failure
	if a.Reason != connectors.FailSinkInvalid || b.Reason != connectors.FailSinkInvalid {
		t.Errorf("reasons %q, %q, want %s", a.Reason, b.Reason, connectors.FailSinkInvalid)
	}
	if !a.LastErrorTime.Equal(b.LastErrorTime) {
		t.Fatalf("the fixed clock was not used: %v, %v", a.LastErrorTime, b.LastErrorTime)
	}
	if a.NextRetryTime.Equal(b.NextRetryTime) {
		t.Errorf("both units retry at %v: no jitter", a.NextRetryTime)
	}
}

// TestBackoffBounds: every wait lies within [Initial, Max], waits are
// jittered, and they grow towards Max.
func TestBackoffBounds(t *testing.T) {
	for _, b := range []connectors.Backoff{
		{Initial: 250 * time.Millisecond, Max: 30 * time.Second},
		{Initial: time.Second, Max: 2 * time.Second}, // Max under 3×Initial
		{Initial: time.Second, Max: time.Second},
		{}, // defaults
	} {
		lo, hi := b.Initial, b.Max
		if lo == 0 {
			lo, hi = 250*time.Millisecond, 30*time.Second
		}
		for n := range 80 {
			seen := map[time.Duration]bool{}
			for range 50 {
				d := b.Wait(n)
				if d < lo || d > hi {
					t.Fatalf("%+v.Wait(%d) = %v, outside [%v, %v]", b, n, d, lo, hi)
				}
				seen[d] = true
			}
			if lo < hi && len(seen) < 2 {
				t.Errorf("%+v.Wait(%d) gave the same wait 50 times: no jitter", b, n)
			}
		}
	}
	b := connectors.Backoff{Initial: 100 * time.Millisecond, Max: time.Minute}
	if first, late := b.Wait(1), b.Wait(20); late < 20*time.Second || first > 300*time.Millisecond {
		t.Errorf("Wait(1) = %v, Wait(20) = %v: want about Initial, then near Max", first, late)
	}
}

// TestOutboundSinkFailure: when a Sink fails, the writes it had under way
// are counted as connection-lost, and a fresh Sink takes over.
func TestOutboundSinkFailure(t *testing.T) {
	pub, url, p, wf := weidaPath(t, "/out", "out.*.data")
	const inFlight = 4
	// The first Sink fails the write that fills its window; the others
	// it holds never complete. The second one works.
	first := &failingSink{fail: inFlight}
	second := &memSink{}
	var built atomic.Int32
	rt, _ := newRuntime(t, func(int) time.Duration { return time.Millisecond })
	err := rt.Apply(context.Background(), []connectors.Unit{{
		Spec: connectors.Spec{
			Name: "out", Protocol: policy.NATS, Direction: policy.Outbound, Policy: p,
			Routes: []connectors.Route{{Name: "r", Foreign: "out.*.data", Weida: wf}}, Endpoint: url, InFlight: inFlight,
		},
		Revision: "1",
		Dial:     func(ctx context.Context) (*weida.Subscriber, error) { return weida.Dial(ctx, url, weida.DialConfig{}) },
		NewSink: func(report connectors.StateFunc) (connectors.Sink, error) {
			report(connectors.ConnState{Up: true, Reason: "Connected"})
			if built.Add(1) == 1 {
				return first, nil
			}
			return second, nil
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the bridge to subscribe", func() bool { return pub.Subscribers() > 0 && rt.Ready() })
	for i := range inFlight {
		if r, err := pub.Publish(context.Background(), weida.Message{Topic: fmt.Sprintf("out.t%d.data", i), Payload: []byte("x")}); err != nil || r.Queued != 1 {
			t.Fatalf("Publish = %+v, %v", r, err)
		}
	}
	waitFor(t, "the lost writes to be counted", func() bool {
		c := statusOf(rt, "out").Counters
		return c.Dropped[connectors.ReasonConnectionLost] == inFlight && c.InFlight == 0
	})
	waitFor(t, "a second attempt", func() bool { return built.Load() == 2 && rt.Ready() })
	waitFor(t, "a message through the new Sink", func() bool {
		r, err := pub.Publish(context.Background(), weida.Message{Topic: "out.after.data", Payload: []byte("x")})
		if err != nil || r.Queued == 0 {
			return false
		}
		return slicesContain(second.writtenTopics(), "out.after.data")
	})
	if !first.isClosed() {
		t.Error("the failed Sink was not closed")
	}
	c := statusOf(rt, "out").Counters
	if c.Bridged < 1 || c.Received < inFlight+1 {
		t.Errorf("counters after the second attempt: %+v", c)
	}
}

func slicesContain(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// failingSink holds every write until the fail-th arrives, which fails
// the Sink; the held ones end with their context.
type failingSink struct {
	fail   int
	mu     sync.Mutex
	writes int
	closed bool
}

func (s *failingSink) Start(context.Context) error { return nil }

func (s *failingSink) Write(ctx context.Context, _ *connectors.Message) error {
	s.mu.Lock()
	s.writes++
	n := s.writes
	s.mu.Unlock()
	if n == s.fail {
		return connectors.Retryable("ConnectionLost", errors.New("broker went away"))
	}
	<-ctx.Done()
	return ctx.Err()
}

func (s *failingSink) Close(context.Context) error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	return nil
}

func (s *failingSink) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// TestClassify: a *Failure decides; otherwise common network and TLS
// errors get a reason, everything else the fallback, all retryable.
func TestClassify(t *testing.T) {
	cases := []struct {
		err       error
		reason    string
		permanent bool
	}{
		{fmt.Errorf("start: %w", connectors.Permanent("BadCredentials", errors.New("x"))), "BadCredentials", true},
		{connectors.Retryable("StreamGone", errors.New("x")), "StreamGone", false},
		{&net.DNSError{Err: "no such host", Name: "broker.invalid"}, connectors.FailDNS, false},
		{&net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, connectors.FailBrokerUnreachable, false},
		{fmt.Errorf("x: %w", syscall.EHOSTUNREACH), connectors.FailBrokerUnreachable, false},
		{&net.OpError{Op: "dial", Err: timeoutErr{}}, connectors.FailBrokerUnreachable, false},
		{fmt.Errorf("handshake: %w", tlsAlert()), connectors.FailTLS, false},
		{errors.New("something else"), "Fallback", false},
	}
	for _, tc := range cases {
		reason, permanent := connectors.Classify(tc.err, "Fallback")
		if reason != tc.reason || permanent != tc.permanent {
			t.Errorf("Classify(%v) = %q, %v; want %q, %v", tc.err, reason, permanent, tc.reason, tc.permanent)
		}
	}
	if got := connectors.Retryable("R", errors.New("the text")).Error(); got != "the text" {
		t.Errorf("Failure.Error() = %q, want Err's text", got)
	}
	inner := errors.New("inner")
	if !errors.Is(connectors.Permanent("R", inner), inner) {
		t.Error("Failure does not unwrap to Err")
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

// tlsAlert is what crypto/tls returns when the peer refuses the handshake
// with a bad_certificate alert.
func tlsAlert() error { return tls.AlertError(42) }

// TestOutboundFingerprintMismatch: a dialled endpoint presenting another
// certificate than the pinned one is reported as FingerprintMismatch, not
// as any dial failure, so that an operator knows the pin is what to fix.
func TestOutboundFingerprintMismatch(t *testing.T) {
	l, err := weida.Listen(context.Background(), "127.0.0.1:0", weida.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	other, err := weida.Listen(context.Background(), "127.0.0.1:0", weida.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	url := "weida://" + other.Fingerprint() + "@" + l.Addr().String() + "/out"
	rt := runDialling(t, "pinned", url, func(ctx context.Context) (*weida.Subscriber, error) { return weida.Dial(ctx, url, weida.DialConfig{}) })
	waitFor(t, "the mismatch to show", func() bool {
		return condition(statusOf(rt, "pinned"), connectors.CondWeidaReady).Reason == connectors.FailFingerprintMismatch
	})
	if rt.Ready() {
		t.Error("ready while the endpoint presents another certificate")
	}
}

// TestOutboundPathNotServed: failover addresses that all answer but
// publish nothing at the resource's path are reported as PathNotServed, so
// an operator looks at the path and at which replica holds the endpoint,
// not at the network.
func TestOutboundPathNotServed(t *testing.T) {
	var urls []string
	for range 2 {
		l, err := weida.Listen(context.Background(), "127.0.0.1:0", weida.ListenConfig{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		if _, err := l.Publisher("/elsewhere"); err != nil {
			t.Fatal(err)
		}
		urls = append(urls, "weida://"+l.Addr().String()+"/out") // unpinned: the two listeners have their own certificates
	}
	f, err := weida.NewFailover(urls, weida.DialConfig{InsecureSkipVerifyForTesting: true}, 0)
	if err != nil {
		t.Fatal(err)
	}
	rt := runDialling(t, "unserved", urls[0], f.Dial)
	waitFor(t, "PathNotServed to show", func() bool {
		return condition(statusOf(rt, "unserved"), connectors.CondWeidaReady).Reason == connectors.FailPathNotServed
	})
}

// runDialling runs an outbound unit named name that dials its endpoint
// url with dial and writes to a sink that is always up, so that its
// WeidaReady condition tells only of the dial.
func runDialling(t *testing.T, name, url string, dial func(context.Context) (*weida.Subscriber, error)) *connectors.Runtime {
	t.Helper()
	rt, _ := newRuntime(t, func(int) time.Duration { return time.Millisecond })
	err := rt.Apply(context.Background(), []connectors.Unit{{
		Spec: connectors.Spec{
			Name: name, Protocol: policy.NATS, Direction: policy.Outbound, Policy: policy.NATSTokensV1(),
			Routes: []connectors.Route{{Name: "r", Foreign: "out.*", Weida: "out.*"}}, Endpoint: url,
		},
		Revision: "1",
		Dial:     dial,
		NewSink: func(report connectors.StateFunc) (connectors.Sink, error) {
			report(connectors.ConnState{Up: true, Reason: "Connected"})
			return &memSink{}, nil
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

// TestSupervisorRetriesWhenFileChanges: a unit waiting out a long backoff
// after a failed attempt starts its next attempt as soon as one of its
// Files changes (a corrected secret), and only then; with nothing changed
// it keeps waiting.
func TestSupervisorRetriesWhenFileChanges(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(secret, []byte("wrong"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := &sources{startErr: func(n int) error {
		b, err := os.ReadFile(secret)
		if err != nil || string(b) != "right" {
			return connectors.Retryable("CredentialsRefused", errors.New("not authorized"))
		}
		return nil
	}}
	rt, _ := newRuntime(t, func(int) time.Duration { return time.Hour })
	u := inboundUnit(t, "files", "127.0.0.1:0", f)
	u.Files = []string{secret}
	if err := rt.Apply(context.Background(), []connectors.Unit{u}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first attempt to fail", func() bool {
		st := statusOf(rt, "files")
		return st.Failure != nil && st.Failure.Reason == "CredentialsRefused"
	})
	// Unchanged files: the hour's backoff holds (several polls pass).
	time.Sleep(800 * time.Millisecond)
	if got := f.count(); got != 1 {
		t.Fatalf("%d attempts with the file unchanged and an hour's backoff, want 1", got)
	}
	tmp := secret + ".tmp"
	if err := os.WriteFile(tmp, []byte("right"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, secret); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the unit to be ready after its file changed", rt.Ready)
	if got := f.count(); got != 2 {
		t.Errorf("%d attempts, want 2: the failed one and the one the change started", got)
	}
}
