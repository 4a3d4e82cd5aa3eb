package weida

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"weida.dev/connector/weida/wire"
)

// TestProbeDrawsResetAfterRestart: an idle subscriber of a publisher
// process that died learns it from the stateless reset its probe draws
// from the restarted one. Both sides run the spec's 30 s idle timeout, so
// only a reset can end the connection within the test's bound, and the
// error says it was one. A subscriber without probes, which sends only
// keep-alive PINGs (too small to be reset), is still on the dead
// connection then.
func TestProbeDrawsResetAfterRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	addr := freeAddr(t)
	slow := Limits{IdleTimeout: 30 * time.Second, KeepAlive: 10 * time.Second}
	a, err := Listen(testCtx(t), addr, ListenConfig{StateDir: dir, Limits: slow})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	publisher(t, a, "/restart")
	probing := dial(t, a, "/restart", DialConfig{Limits: slow})
	silent := dial(t, a, "/restart", DialConfig{Limits: slow, ProbeAfter: -1})
	subscribe(t, a, probing, 1, "")
	subscribe(t, a, silent, 2, "")
	// A SUBSCRIBE not yet acknowledged when the process dies is sent again,
	// and that alone would draw a reset: wait until neither subscriber has
	// sent anything for a while, so that the first packet the probing one
	// sends after the crash is a probe.
	settle(t, probing, silent)

	_ = a.udp.Close() // the process is gone: no CONNECTION_CLOSE leaves
	b, err := Listen(testCtx(t), addr, ListenConfig{StateDir: dir, Limits: slow})
	if err != nil {
		t.Fatalf("Listen again: %v", err)
	}
	defer b.Close()
	restarted := time.Now()

	select {
	case <-probing.Done():
	case <-time.After(lostWithin):
		t.Fatalf("the probing subscriber is still on the dead connection %v after the restart (%d probes)", lostWithin, probing.Stats().Probes)
	}
	err = probing.Err()
	t.Logf("lost its connection %v after the restart, %d probes: %v", time.Since(restarted).Round(time.Millisecond), probing.Stats().Probes, err)
	var reset *quic.StatelessResetError
	if !errors.As(err, &reset) {
		t.Fatalf("the probing subscriber ended with %v, want a stateless reset", err)
	}
	if probing.Stats().Probes == 0 {
		t.Error("no probe counted")
	}
	if err := silent.Err(); err != nil {
		t.Errorf("the subscriber without probes lost its connection too: %v", err)
	}
	if n := silent.Stats().Probes; n != 0 {
		t.Errorf("ProbeAfter -1 sent %d probes", n)
	}
}

// settle waits until none of subs has sent a packet for 400 ms: longer
// than a probe timeout on a loaded machine, so that a packet the listener
// had not acknowledged yet shows as a retransmission here rather than
// after the restart (where, being large enough, it would draw the reset
// in the probe's place), and shorter than ProbeAfter.
func settle(t *testing.T, subs ...*Subscriber) {
	t.Helper()
	sent := func() (n uint64) {
		for _, s := range subs {
			n += s.c.qc.ConnectionStats().PacketsSent
		}
		return n
	}
	last, stable := sent(), 0
	waitFor(t, "the subscribers to fall silent", func() bool {
		time.Sleep(50 * time.Millisecond)
		if n := sent(); n != last {
			last, stable = n, 0
			return false
		}
		stable++
		return stable >= 8
	})
}

// countingReplayer replays one message per call and counts the calls.
type countingReplayer struct{ calls atomic.Int64 }

func (r *countingReplayer) Replay(filter string, yield func(Message) bool) {
	r.calls.Add(1)
	yield(Message{Topic: "last", Payload: []byte("replayed")})
}

// TestProbeIsNoOpAtPublisher: a subscriber probing all the time (its
// ProbeAfter is far below the listener's 500 ms keep-alive) leaves our
// publisher's state as it was: one subscription, one replay, no refusal or
// violation, and one copy per message.
func TestProbeIsNoOpAtPublisher(t *testing.T) {
	l := listen(t, ListenConfig{})
	p := publisher(t, l, "/noop")
	var r countingReplayer
	p.SetReplayer(&r)
	s := dial(t, l, "/noop", DialConfig{ProbeAfter: 10 * time.Millisecond})
	subscribe(t, l, s, 1, "#")
	if m := receive(t, s); string(m.Payload) != "replayed" {
		t.Fatalf("first copy %q, want the replay", m.Payload)
	}
	waitFor(t, "5 probes", func() bool { return s.Stats().Probes >= 5 })
	publish(t, p, "live", []byte("live"))
	if m := receive(t, s); string(m.Payload) != "live" {
		t.Fatalf("received %q after the probes, want the live copy (a probe replayed again?)", m.Payload)
	}
	st := l.Stats()
	if st.Subscriptions != 1 || st.CopiesReplayed != 1 || st.CopiesQueued != 1 ||
		st.StreamsRefused != 0 || st.ProtocolViolations != 0 || st.Connections != 1 {
		t.Errorf("listener after %d probes: %+v", s.Stats().Probes, st)
	}
	if n := r.calls.Load(); n != 1 {
		t.Errorf("Replay called %d times, want 1", n)
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
}

// TestProbeFrame: the probe is a SUBSCRIBE of the held filter on the
// dialled path, padded with extension key 64, that decodes to exactly that
// SUBSCRIBE; a subscriber holding no filter sends none.
func TestProbeFrame(t *testing.T) {
	srv := rawListen(t)
	frames := make(chan []byte, 16)
	srv.start(func(qc *quic.Conn) {
		sendUni(qc, helloFrame(wire.NewHello(16384, 1024)))
		for {
			st, err := qc.AcceptUniStream(qc.Context())
			if err != nil {
				return
			}
			k, hdr, err := wire.ReadPreamble(st, 16384, nil)
			if err != nil || k == wire.KindHello {
				continue
			}
			select {
			case frames <- append([]byte{byte(k)}, hdr...):
			default:
			}
		}
	})
	s, err := Dial(testCtx(t), srv.url("/raw"), DialConfig{InsecureSkipVerifyForTesting: true, ProbeAfter: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Five probe periods of silence without a filter: no probe. (On a
	// stalled machine the check is weaker, never wrong.)
	time.Sleep(100 * time.Millisecond)
	if n := s.Stats().Probes; n != 0 {
		t.Fatalf("%d probes without a filter held", n)
	}
	if err := s.Subscribe(testCtx(t), "px.*"); err != nil {
		t.Fatal(err)
	}
	next := func() []byte {
		select {
		case f := <-frames:
			return f
		case <-testCtx(t).Done():
			t.Fatal("no frame arrived")
			return nil
		}
	}
	plain := next()
	probe := next()
	want := wire.Subscribe{Endpoint: "/raw", Filter: "px.*"}
	if wire.Kind(plain[0]) != wire.KindSubscribe || string(plain[1:]) != string(wire.AppendSubscribe(nil, &want)) {
		t.Fatalf("first frame % X, want the plain SUBSCRIBE", plain)
	}
	if wire.Kind(probe[0]) != wire.KindSubscribe || string(probe[1:]) != string(wire.AppendSubscribePadded(nil, &want, probePadding)) {
		t.Fatalf("probe % X, want the padded SUBSCRIBE", probe)
	}
	if got, err := wire.DecodeSubscribe(probe[1:]); err != nil || got != want {
		t.Fatalf("probe decodes to %+v, %v", got, err)
	}
}
