package weida

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"weida.dev/connector/weida/wire"
)

func TestAddressKey(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"192.0.2.7:1", "192.0.2.7"},
		{"[::ffff:192.0.2.7]:1", "192.0.2.7"},
		{"[2001:db8:1:2:aaaa:bbbb:cccc:dddd]:1", "2001:db8:1:2::"},
		{"[2001:db8:1:2::1]:9", "2001:db8:1:2::"},
		{"[fe80::1%lo]:1", "fe80::"},
	} {
		ua, err := net.ResolveUDPAddr("udp", c.in)
		if err != nil {
			t.Fatal(err)
		}
		if got := addressKey(ua); got != netip.MustParseAddr(c.want) {
			t.Errorf("addressKey(%s) = %s, want %s", c.in, got, c.want)
		}
	}
}

// secondHost returns a UDP socket on 127.0.0.2: Linux routes all of
// 127.0.0.0/8 to lo, so connections from it come from a second address.
func secondHost(t *testing.T) *quic.Transport {
	t.Helper()
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2)})
	if err != nil {
		t.Skipf("no second loopback address: %v", err)
	}
	tr := &quic.Transport{Conn: udp}
	t.Cleanup(func() {
		_ = tr.Close()
		_ = udp.Close()
	})
	return tr
}

// TestOneHostCannotTakeEverySlot: one address opening more connections
// than the listener serves (bare handshakes, as the attacker of issue 25
// did) is refused past MaxConnectionsPerAddress, and a subscriber from
// another address still connects and receives.
//
// Nothing here is a measurement: on a loaded machine the flood may take
// many times longer than on a quiet one, so every bound is a safety net
// and the flood's connections are kept from timing out on their own.
func TestOneHostCannotTakeEverySlot(t *testing.T) {
	var logs logBuffer
	// The flood's connections send no HELLO, and on a loaded machine the
	// test's side of them may go unscheduled for seconds: a HelloTimeout
	// and an IdleTimeout longer than any run let them hold their slots for
	// the whole test, as live connections that did send one would. With
	// the listener's 2 s default, one that went unanswered that long was
	// dropped, its slot went to the next handshake, and weida admitted 65.
	l := listen(t, ListenConfig{Logger: logs.logger(), Limits: Limits{HelloTimeout: time.Hour, IdleTimeout: time.Hour}})
	p := publisher(t, l, "/open")
	tr := secondHost(t)

	const flood = 1100
	// HandshakeIdleTimeout bounds a silent handshake, not a slow one: with
	// quic-go's 5 s a starved flood timed its handshakes out and fell
	// short of the limit. MaxIdleTimeout (QUIC takes the smaller of the
	// two) bounds how long a connection the listener dropped silently
	// stays open here. KeepAlivePeriod makes a connection whose
	// CONNECTION_CLOSE was lost ask again (the listener answers with the
	// close or a stateless reset) instead of waiting out its idle timeout.
	fconf := &quic.Config{HandshakeIdleTimeout: testTimeout, MaxIdleTimeout: testTimeout, KeepAlivePeriod: time.Second}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []*quic.Conn
	)
	sem := make(chan struct{}, 64)
	start := time.Now()
	for range flood {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			qc, err := tr.Dial(t.Context(), l.Addr(), rawTLS(), fconf)
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, qc)
			mu.Unlock()
		})
	}
	wg.Wait()
	defer func() {
		for _, qc := range conns {
			_ = qc.CloseWithError(0, "")
		}
	}()
	n := len(conns)
	if n < DefaultMaxConnectionsPerAddress+1 {
		t.Fatalf("only %d of %d handshakes completed", n, flood)
	}

	// Every handshake the flood saw complete ends one of three ways.
	// Weida admits it, and it stays open (see the timeouts above); weida
	// refuses it, and it is closed with an application error; or quic-go
	// refuses it below weida, with a bare CONNECTION_REFUSED, because its
	// accept queue (32 connections) was full when the handshake completed
	// on the listener's side, or drops it, its handshake timed out there:
	// weida never sees those. All are settled once the flood's open
	// connections are exactly the listener's.
	tally := func() (open int, told []*quic.ApplicationError, below []error) {
		for _, qc := range conns {
			select {
			case <-qc.Context().Done():
			default:
				open++
				continue
			}
			var ae *quic.ApplicationError
			if err := context.Cause(qc.Context()); errors.As(err, &ae) {
				told = append(told, ae)
			} else {
				below = append(below, err)
			}
		}
		return open, told, below
	}
	// A handshake the listener's side dropped silently (quic-go's
	// 10 s handshake timeout, on a starved machine) stays open on the
	// flood's side until its idle timeout: the wait outlasts that.
	waitForWithin(t, "every handshake to be admitted or refused", testTimeout+fconf.MaxIdleTimeout, func() bool {
		open, _, _ := tally()
		return open == l.Stats().Connections
	})
	refusing := time.Since(start) // weida refused none of the flood after this
	st := l.Stats()
	_, told, below := tally()
	t.Logf("%d of %d handshakes from one address completed: %d admitted, %d refused by weida, %d refused or dropped below it",
		n, flood, st.ConnectionsAccepted, st.ConnectionsRefused, len(below))
	if st.ConnectionsRefused == 0 {
		t.Fatalf("weida saw %d of the %d handshakes (%d refused or dropped below it): none past the limit to refuse", st.ConnectionsAccepted, n, len(below))
	}
	if st.ConnectionsAccepted != DefaultMaxConnectionsPerAddress || st.Connections != DefaultMaxConnectionsPerAddress ||
		st.ConnectionsRefused != st.RefusedBy.MaxConnectionsPerAddr {
		t.Fatalf("after %d handshakes from one address: %+v\n%s", n, st, endedLines(logs.String()))
	}
	// A refused connection is told why: every one whose CONNECTION_CLOSE
	// arrived (over loopback, all but those a full socket buffer dropped).
	if len(told) == 0 {
		t.Errorf("none of the %d connections weida refused was told why; %d closed below weida: %v", st.ConnectionsRefused, len(below), below[:min(len(below), 3)])
	}
	for _, ae := range told {
		if ae.ErrorCode != quic.ApplicationErrorCode(LimitExceeded) || ae.ErrorMessage != RefusedMaxConnectionsPerAddr {
			t.Errorf("a refused connection was closed with %v, want LIMIT_EXCEEDED %s", ae, RefusedMaxConnectionsPerAddr)
			break
		}
	}
	// Rate-limited: one line per rateLogInterval at most while weida
	// refused, however long a loaded machine made that last.
	most := 1 + int(refusing/rateLogInterval)
	if lines := strings.Count(logs.String(), "weida: refusing connection"); lines < 1 || lines > most {
		t.Errorf("%d refusal lines logged for %d refusals in %s, want 1 to %d (rate-limited)", lines, st.ConnectionsRefused, refusing, most)
	}

	// The subscriber dials from 127.0.0.1, another address, while the
	// flood holds its 64 slots. Dial does not retry: refused, it fails;
	// the bound is only a safety net.
	ctx := testCtx(t)
	s, err := Dial(ctx, pinnedURL(l, "/open"), DialConfig{})
	if err != nil {
		t.Fatalf("subscriber from another address: %v", err)
	}
	defer s.Close()
	if err := s.Subscribe(ctx, "#"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the subscription", func() bool { return p.Subscribers() == 1 })
	if _, err := p.Publish(ctx, Message{Topic: "t", Payload: []byte("hi")}); err != nil {
		t.Fatal(err)
	}
	m, err := s.Receive(ctx)
	if err != nil || string(m.Payload) != "hi" {
		t.Fatalf("Receive: %q, %v", m.Payload, err)
	}
}

// endedLines returns the "connection ended" lines of a listener's debug
// log: why the connections it admitted are gone.
func endedLines(log string) string {
	var b strings.Builder
	for line := range strings.Lines(log) {
		if strings.Contains(line, "weida: connection ended") || strings.Contains(line, "weida: closing connection") {
			b.WriteString(line)
		}
	}
	return b.String()
}

// TestPerAddressLimitSparesAllowlistedPeers: on a listener with an
// allowlist a proved fingerprint is bounded by MaxConnectionsPerPeer
// alone; on an open one a certificate proves nothing and the address
// counts.
func TestPerAddressLimitSparesAllowlistedPeers(t *testing.T) {
	client := newCert(t, "client", nil)
	fp := Fingerprint(client.cert)
	l := listen(t, ListenConfig{ClientFingerprints: []string{fp}, Limits: Limits{MaxConnectionsPerAddress: 1}})
	cfg := DialConfig{CertFile: client.certFile, KeyFile: client.keyFile}
	dial(t, l, "/a", cfg)
	dial(t, l, "/a", cfg)

	open := listen(t, ListenConfig{Limits: Limits{MaxConnectionsPerAddress: 1}})
	dial(t, open, "/a", cfg)
	_, err := Dial(testCtx(t), pinnedURL(open, "/a"), DialConfig{})
	var ce *CloseError
	if !errors.As(err, &ce) || ce.Code != LimitExceeded || ce.Reason != RefusedMaxConnectionsPerAddr {
		t.Fatalf("second connection from one address on an open listener: %v, want LIMIT_EXCEEDED %s", err, RefusedMaxConnectionsPerAddr)
	}
}

// bigReplayer replays n topics of size bytes each for any filter.
type bigReplayer struct {
	n, size int
}

func (r bigReplayer) Replay(filter string, yield func(Message) bool) {
	payload := make([]byte, r.size)
	for i := range r.n {
		if !yield(Message{Topic: fmt.Sprintf("cache.%d", i), Payload: payload}) {
			return
		}
	}
}

// TestResubscribeFloodDropsAreItsOwn: a client that subscribes and
// unsubscribes in a loop on a path with a large last-value cache, never
// reading, has its drops counted as OwnReplay; another subscriber that
// reads keeps every live copy, and BufferFull stays at zero.
func TestResubscribeFloodDropsAreItsOwn(t *testing.T) {
	l := listen(t, ListenConfig{Limits: Limits{SubscriberBufferBytes: 256 << 10, ReplayBurst: 1000}})
	p := publisher(t, l, "/lv")
	p.SetReplayer(bigReplayer{n: 10000, size: 64})

	victim := dial(t, l, "/lv", DialConfig{})
	subscribe(t, l, victim, 1, "live")

	r := rawDial(t, l)
	r.hello()
	const rounds = 50
	for range rounds {
		r.send(subscribeFrame(wire.KindSubscribe, "/lv", "#"))
		r.send(subscribeFrame(wire.KindUnsubscribe, "/lv", "#"))
	}
	r.send(subscribeFrame(wire.KindSubscribe, "/lv", "#"))
	waitFor(t, "the flood's SUBSCRIBEs", func() bool { return l.Stats().Subscriptions == 2 })

	var own int
	for i := range 20 {
		res := publish(t, p, "live", fmt.Appendf(nil, "%d", i))
		own += res.OwnReplay
		if m := receive(t, victim); string(m.Payload) != fmt.Sprint(i) {
			t.Fatalf("victim got %q, want %d", m.Payload, i)
		}
	}
	st := l.Stats()
	if st.Dropped.BufferFull != 0 {
		t.Errorf("BufferFull = %d: the flood's drops were counted as another subscriber's", st.Dropped.BufferFull)
	}
	if st.Dropped.OwnReplay == 0 || own == 0 {
		t.Errorf("OwnReplay = %d, Result.OwnReplay summed = %d; want both > 0", st.Dropped.OwnReplay, own)
	}
}

// TestReplayLimit: past ReplayBurst, a SUBSCRIBE is applied (live copies
// arrive) without its replay, and counted.
func TestReplayLimit(t *testing.T) {
	var logs logBuffer
	l := listen(t, ListenConfig{Logger: logs.logger(), Limits: Limits{ReplayBurst: 2, ReplayInterval: time.Hour}})
	p := publisher(t, l, "/lv")
	var r storeReplayer
	p.SetReplayer(&r)
	for _, tp := range []string{"a.x", "b.x", "c.x", "d.x"} {
		r.publish(t, p, tp, tp+"=old")
	}
	s := dial(t, l, "/lv", DialConfig{})
	subscribe(t, l, s, 1, "a.*")
	subscribe(t, l, s, 2, "b.*")
	subscribe(t, l, s, 3, "c.*")
	subscribe(t, l, s, 4, "d.*")
	got := map[string]bool{}
	for range 2 {
		got[string(receive(t, s).Payload)] = true
	}
	if !got["a.x=old"] || !got["b.x=old"] {
		t.Fatalf("replayed %v, want a.x and b.x", got)
	}
	r.publish(t, p, "c.x", "c.x=new")
	if m := receive(t, s); string(m.Payload) != "c.x=new" {
		t.Fatalf("after the limit, got %q, want the live c.x=new (no replay)", m.Payload)
	}
	st := l.Stats()
	if st.ReplaysLimited != 2 || st.CopiesReplayed != 2 {
		t.Errorf("ReplaysLimited = %d, CopiesReplayed = %d; want 2 and 2", st.ReplaysLimited, st.CopiesReplayed)
	}
	if lines := strings.Count(logs.String(), "SUBSCRIBE not replayed"); lines != 1 {
		t.Errorf("%d replay-limit lines logged, want 1 (rate-limited)", lines)
	}
}
