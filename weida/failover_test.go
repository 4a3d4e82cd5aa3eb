package weida

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"testing"

	"weida.dev/connector/weida/address"
)

// replicas starts n listeners on loopback that present one identity (they
// share a state directory, as replicas of one endpoint share its
// certificate), each with a publisher on path.
func replicas(t *testing.T, n int, path string) ([]*Listener, []*Publisher, []string) {
	t.Helper()
	dir := t.TempDir()
	var ls []*Listener
	var ps []*Publisher
	var urls []string
	for range n {
		l := listen(t, ListenConfig{StateDir: dir})
		ls = append(ls, l)
		ps = append(ps, publisher(t, l, path))
		urls = append(urls, pinnedURL(l, path))
	}
	if ls[0].Fingerprint() != ls[n-1].Fingerprint() {
		t.Fatal("the replicas present different certificates")
	}
	return ls, ps, urls
}

// silentAddr returns a loopback UDP address that takes packets and never
// answers, as a stopped replica whose host drops them does.
func silentAddr(t *testing.T) string {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c.LocalAddr().String()
}

func newFailover(t *testing.T, urls []string) *Failover {
	t.Helper()
	f, err := NewFailover(urls, DialConfig{}, 0)
	if err != nil {
		t.Fatalf("NewFailover: %v", err)
	}
	return f
}

// roundTrip subscribes s to "#" at p's listener and has one message pass.
func roundTrip(t *testing.T, l *Listener, p *Publisher, s *Subscriber, payload string) {
	t.Helper()
	subscribe(t, l, s, 1, "#")
	if r := publish(t, p, "a.b", []byte(payload)); r.Queued != 1 {
		t.Fatalf("publish on %s queued %d copies, want 1", l.Addr(), r.Queued)
	}
	if m := receive(t, s); string(m.Payload) != payload {
		t.Fatalf("received %q, want %q", m.Payload, payload)
	}
}

// A lost connection moves the next Dial to the next address, with the same
// path, filters and pin; a connection closed on purpose keeps the address.
func TestFailoverMovesOnLoss(t *testing.T) {
	ls, ps, urls := replicas(t, 2, "/orders")
	// Both addresses answer: a stagger longer than any handshake keeps
	// the second from being dialled while the first is being, so that
	// which one answers does not depend on the machine's load.
	f, err := NewFailover(urls, DialConfig{}, testTimeout)
	if err != nil {
		t.Fatal(err)
	}

	s, err := f.Dial(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if s.URL() != urls[0] {
		t.Fatalf("first Dial reached %s, want the first address %s", s.URL(), urls[0])
	}
	roundTrip(t, ls[0], ps[0], s, "one")
	_ = s.Close()

	// Closed by this side: the first address is still the one to use.
	s, err = f.Dial(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if s.URL() != urls[0] {
		t.Fatalf("after a Close, Dial reached %s, want %s again", s.URL(), urls[0])
	}
	roundTrip(t, ls[0], ps[0], s, "two")

	// The first replica goes away: its connection is lost, and the next
	// Dial reaches the second, where messages flow again.
	_ = ls[0].Close()
	<-s.Done()
	_ = s.Close()
	s, err = f.Dial(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.URL() != urls[1] {
		t.Fatalf("after the loss, Dial reached %s, want the second address %s", s.URL(), urls[1])
	}
	roundTrip(t, ls[1], ps[1], s, "three")
}

// An address that never answers costs a stagger: Dial reaches the next
// one well within a handshake timeout, and prefers it from then on.
func TestFailoverPassesSilentAddress(t *testing.T) {
	ls, ps, urls := replicas(t, 1, "/orders")
	a, _ := address.Parse(urls[0])
	dead := fmt.Sprintf("weida://%s@%s/orders", a.Fingerprint, silentAddr(t))
	f := newFailover(t, []string{dead, urls[0]})
	for i := range 2 {
		s, err := f.Dial(testCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		if s.URL() != urls[0] {
			t.Fatalf("Dial %d reached %s, want %s", i, s.URL(), urls[0])
		}
		roundTrip(t, ls[0], ps[0], s, "x")
		_ = s.Close()
		waitFor(t, "no subscriptions", func() bool { return ls[0].Stats().Subscriptions == 0 })
	}
}

// When no address answers, the error says why for each, and unwraps to
// each: here both present a certificate that is not the pinned one.
func TestFailoverEveryAddressFails(t *testing.T) {
	_, _, urls := replicas(t, 2, "/orders")
	wrong := "sha256:" + strings.Repeat("0", 64)
	var pinned []string
	for _, u := range urls {
		a, _ := address.Parse(u)
		a.Fingerprint = wrong
		pinned = append(pinned, a.String())
	}
	_, err := newFailover(t, pinned).Dial(testCtx(t))
	var fe *FailoverError
	if !errors.As(err, &fe) || !errors.Is(err, ErrFingerprintMismatch) {
		t.Fatalf("Dial = %v, want a *FailoverError wrapping ErrFingerprintMismatch", err)
	}
	for i, e := range fe.Errs {
		if e == nil || !strings.Contains(err.Error(), pinned[i]) {
			t.Errorf("address %d: error %v; the message %q should name %s", i, e, err, pinned[i])
		}
	}
}

func TestNewFailoverRefusesOtherEndpoints(t *testing.T) {
	fp := "sha256:" + strings.Repeat("ab", 32)
	for _, c := range []struct {
		urls []string
		rule string
	}{
		{[]string{"weida://" + fp + "@127.0.0.1:1/a", "weida://" + fp + "@127.0.0.1:2/b"}, "replica-path"},
		{[]string{"weida://" + fp + "@127.0.0.1:1/a", "weida://127.0.0.1:2/a"}, "replica-pin"},
		{[]string{"weida://" + fp + "@127.0.0.1:1/a", "weida://" + fp + "@127.0.0.1:1/a"}, "replica-duplicate"},
	} {
		_, err := NewFailover(c.urls, DialConfig{}, 0)
		var re *address.ReplicaError
		if !errors.As(err, &re) || re.Rule != c.rule || re.Index != 1 {
			t.Errorf("NewFailover(%q) = %v, want rule %s at address 2", c.urls, err, c.rule)
		}
	}
	if _, err := NewFailover([]string{"weida://h:1/a", "http://h:2/a"}, DialConfig{}, 0); !errors.Is(err, address.ErrSyntax) {
		t.Errorf("NewFailover with a bad URL = %v", err)
	}
	if _, err := NewFailover(nil, DialConfig{}, 0); err == nil {
		t.Error("NewFailover without URLs succeeded")
	}
}

// Once ctx has ended, a failed dial starts no other: the addresses not yet
// tried stay nil in the FailoverError, and nothing says "dialling the
// next" about a dial that only failed because ctx had.
func TestFailoverStopsWhenCtxEnds(t *testing.T) {
	_, _, urls := replicas(t, 3, "/orders")
	var logs logBuffer
	f, err := NewFailover(urls, DialConfig{Logger: logs.logger()}, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = f.Dial(ctx)
	var fe *FailoverError
	if !errors.As(err, &fe) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Dial = %v, want a *FailoverError wrapping context.Canceled", err)
	}
	if fe.Errs[0] == nil || fe.Errs[1] != nil || fe.Errs[2] != nil {
		t.Errorf("Errs = %v, want the first address's error and nil for the two not tried", fe.Errs)
	}
	if strings.Contains(logs.String(), "dialling the next") {
		t.Errorf("logged a move to the next address after ctx ended:\n%s", logs.String())
	}
}

// A Failover does not keep the Subscriber it returned alive once the
// caller has closed and dropped it: only how its connection ended.
func TestFailoverForgetsClosedSubscriber(t *testing.T) {
	_, _, urls := replicas(t, 2, "/orders")
	f := newFailover(t, urls)
	defer runtime.KeepAlive(f) // f must outlive the collections
	s, err := f.Dial(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	collected := make(chan struct{})
	runtime.AddCleanup(s, func(ch chan struct{}) { close(ch) }, collected)
	_ = s.Close()
	s = nil
	for range 20 {
		runtime.GC()
		select {
		case <-collected:
			return
		default:
		}
		runtime.Gosched()
	}
	t.Fatal("the closed Subscriber is still reachable after 20 collections")
}

// A listener that publishes another path on an address of the endpoint
// completes HELLO like a replica, but would record the SUBSCRIBE and send
// nothing: Dial passes it, and fails with ErrPathNotServed when no address
// publishes the path.
func TestFailoverPassesAddressWithoutThePath(t *testing.T) {
	ls, ps, urls := replicas(t, 2, "/orders")
	_ = ps[0].Close()
	publisher(t, ls[0], "/prices") // the first address now serves another endpoint
	// A stagger longer than any handshake: without the path check, the
	// first address would win.
	f, err := NewFailover(urls, DialConfig{}, testTimeout)
	if err != nil {
		t.Fatal(err)
	}
	s, err := f.Dial(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if s.URL() != urls[1] {
		t.Fatalf("Dial reached %s, which does not publish /orders; want %s", s.URL(), urls[1])
	}
	roundTrip(t, ls[1], ps[1], s, "x")
	_ = s.Close()

	_ = ps[1].Close()
	_, err = f.Dial(testCtx(t))
	var fe *FailoverError
	if !errors.As(err, &fe) || !errors.Is(err, ErrPathNotServed) || !errors.Is(fe.Errs[0], ErrPathNotServed) || !errors.Is(fe.Errs[1], ErrPathNotServed) {
		t.Fatalf("Dial with no address publishing the path = %v, want ErrPathNotServed for both", err)
	}
}
