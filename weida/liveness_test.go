package weida

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
)

// lostWithin bounds how long these tests let a dead peer go unnoticed. It
// only tells "seconds" from the 30 s idle timeout the issue was about; the
// expected times are about 2 s.
const lostWithin = 12 * time.Second

// TestListenerLimitsDefaults: a listener runs the short idle timeout and
// sends keep-alives; a dialler keeps PROTOCOL §2.4's values.
func TestListenerLimitsDefaults(t *testing.T) {
	l, _ := Limits{}.withDefaults(true)
	if c := l.quicConfig(); c.MaxIdleTimeout != DefaultListenerIdleTimeout || c.KeepAlivePeriod != DefaultListenerKeepAlive {
		t.Errorf("listener: idle %v, keep-alive %v", c.MaxIdleTimeout, c.KeepAlivePeriod)
	}
	d, _ := Limits{}.withDefaults(false)
	if c := d.quicConfig(); c.MaxIdleTimeout != DefaultIdleTimeout || c.KeepAlivePeriod != DefaultKeepAlive {
		t.Errorf("dialler: idle %v, keep-alive %v", c.MaxIdleTimeout, c.KeepAlivePeriod)
	}
	o, _ := Limits{IdleTimeout: time.Minute, KeepAlive: time.Second}.withDefaults(true)
	if o.IdleTimeout != time.Minute || o.KeepAlive != time.Second {
		t.Errorf("set values replaced: %+v", o)
	}
}

// TestIdleSubscriberStaysUp: a subscriber dialled with the default 10 s
// keep-alive holds a listener connection idle well past the listener's 2 s
// idle timeout, because the listener's PINGs are acknowledged.
func TestIdleSubscriberStaysUp(t *testing.T) {
	t.Parallel()
	l := listen(t, ListenConfig{})
	p := publisher(t, l, "/idle")
	s := dial(t, l, "/idle", DialConfig{})
	subscribe(t, l, s, 1, "")
	select {
	case <-s.Done():
		t.Fatalf("the idle subscriber lost its connection: %v", s.Err())
	case <-time.After(3*DefaultListenerIdleTimeout + time.Second):
	}
	if r := publish(t, p, "t", []byte("still here")); r.Queued != 1 {
		t.Fatalf("publish after idling: %+v", r)
	}
	if m := receive(t, s); string(m.Payload) != "still here" {
		t.Fatalf("received %q", m.Payload)
	}
	if st := l.Stats(); st.Connections != 1 || st.Dropped.Total() != 0 {
		t.Fatalf("listener after idling: %+v", st)
	}
}

// TestKilledSubscriberNoticed: a subscriber whose socket vanishes without a
// CONNECTION_CLOSE (a killed process) is noticed by the listener within
// seconds, and the copies still queued for it are counted as
// connection-closed drops then.
func TestKilledSubscriberNoticed(t *testing.T) {
	t.Parallel()
	l := listen(t, ListenConfig{})
	p := publisher(t, l, "/killed")
	s := dial(t, l, "/killed", DialConfig{})
	subscribe(t, l, s, 1, "")

	_ = s.udp.Close() // the process is gone: no CONNECTION_CLOSE leaves
	killed := time.Now()
	// More than the congestion window lets out without acknowledgements,
	// so that most copies are still queued when the connection dies.
	const copies = 300
	payload := bytes.Repeat([]byte("k"), 4096)
	for range copies {
		if r := publish(t, p, "t", payload); r.Queued != 1 {
			t.Fatalf("publish: %+v", r)
		}
	}
	deadline := killed.Add(lostWithin)
	for l.Stats().Connections != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the killed subscriber was not noticed within %v: %+v", lostWithin, l.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("killed subscriber noticed after %v", time.Since(killed).Round(time.Millisecond))
	st := l.Stats()
	if st.Subscriptions != 0 {
		t.Errorf("subscriptions left: %d", st.Subscriptions)
	}
	if st.Dropped.ConnectionClosed == 0 {
		t.Errorf("no copy counted as connection-closed: %+v", st)
	}
	if got := st.CopiesWritten + st.CopiesRefused + st.Dropped.ConnectionClosed; got != copies {
		t.Errorf("written %d + refused %d + connection-closed %d = %d, want every one of the %d queued copies",
			st.CopiesWritten, st.CopiesRefused, st.Dropped.ConnectionClosed, got, copies)
	}
}

// TestStatelessResetAfterCrash: a listener dies without closing its
// connections, and a new one starts on the same address. The new one
// answers the old connections' packets with a stateless reset, so their
// subscribers learn within seconds that they are gone: with a StateDir
// because the reset key is kept there (and then dialling again with the
// same pin succeeds), without one because the key is the process's own.
func TestStatelessResetAfterCrash(t *testing.T) {
	t.Parallel()
	t.Run("state dir", func(t *testing.T) { testStatelessReset(t, t.TempDir()) })
	t.Run("no state dir", func(t *testing.T) { testStatelessReset(t, "") })
}

func testStatelessReset(t *testing.T, dir string) {
	addr := freeAddr(t)
	a, err := Listen(testCtx(t), addr, ListenConfig{StateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	url := pinnedURL(a, "/crash")
	publisher(t, a, "/crash")
	// Two subscribers: one idle, which learns of the crash from its idle
	// timeout or a reset, whichever comes first, and one that sends a
	// SUBSCRIBE after the restart, which is large enough to be answered
	// with a reset (quic-go does not answer packets of 42 bytes or less,
	// such as a lone keep-alive PING, lest it answer a reset with one).
	idle := dial(t, a, "/crash", DialConfig{})
	busy := dial(t, a, "/crash", DialConfig{})
	subscribe(t, a, idle, 1, "")
	subscribe(t, a, busy, 2, "a")

	_ = a.udp.Close() // the process is gone: no CONNECTION_CLOSE leaves
	b, err := Listen(testCtx(t), addr, ListenConfig{StateDir: dir})
	if err != nil {
		t.Fatalf("Listen B: %v", err)
	}
	defer b.Close()
	restarted := time.Now()
	_ = busy.Subscribe(testCtx(t), "some.longer.filter.to.make.the.packet.large")

	for _, s := range []struct {
		name  string
		sub   *Subscriber
		reset bool
	}{{"busy", busy, true}, {"idle", idle, false}} {
		select {
		case <-s.sub.Done():
		case <-time.After(lostWithin - time.Since(restarted)):
			t.Fatalf("%s subscriber still connected %v after the restart", s.name, lostWithin)
		}
		err := s.sub.Err()
		var reset *quic.StatelessResetError
		t.Logf("%s subscriber lost its connection after %v: %v", s.name, time.Since(restarted).Round(time.Millisecond), err)
		if s.reset && !errors.As(err, &reset) {
			t.Errorf("%s subscriber: %v, want a stateless reset", s.name, err)
		}
	}
	if dir == "" {
		if b.Fingerprint() == a.Fingerprint() {
			t.Error("without a StateDir the restarted listener kept its fingerprint")
		}
		return
	}

	p := publisher(t, b, "/crash")
	s, err := Dial(testCtx(t), url, DialConfig{})
	if err != nil {
		t.Fatalf("dialling again with the pin of the crashed listener: %v", err)
	}
	defer s.Close()
	subscribe(t, b, s, 1, "")
	publish(t, p, "after.restart", []byte("again"))
	if m := receive(t, s); string(m.Payload) != "again" {
		t.Fatalf("received %q", m.Payload)
	}
}
