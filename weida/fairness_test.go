package weida

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
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
func TestOneHostCannotTakeEverySlot(t *testing.T) {
	var logs logBuffer
	// The flood's connections send no HELLO: a long HelloTimeout lets
	// them hold their slots for the whole test, as connections that did
	// send one would.
	l := listen(t, ListenConfig{Logger: logs.logger(), Limits: Limits{HelloTimeout: time.Minute}})
	p := publisher(t, l, "/open")
	tr := secondHost(t)

	const flood = 1100
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		conns    []*quic.Conn
		handshot atomic.Int64
	)
	sem := make(chan struct{}, 64)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	for range flood {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			qc, err := tr.Dial(ctx, l.Addr(), rawTLS(), &quic.Config{HandshakeIdleTimeout: 5 * time.Second})
			if err != nil {
				return
			}
			handshot.Add(1)
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
	n := handshot.Load()
	if n < DefaultMaxConnectionsPerAddress+1 {
		t.Fatalf("only %d of %d handshakes completed", n, flood)
	}
	// quic-go refuses, below weida, a handshaken connection that finds
	// its accept queue full: the client saw its handshake complete, the
	// listener never sees it. Most are weida's to admit or refuse.
	waitFor(t, "the handshakes to be admitted or refused", func() bool {
		st := l.Stats()
		return int64(st.ConnectionsAccepted+st.ConnectionsRefused) >= n*9/10
	})
	st := l.Stats()
	if st.ConnectionsAccepted != DefaultMaxConnectionsPerAddress || st.Connections != DefaultMaxConnectionsPerAddress ||
		st.ConnectionsRefused != st.RefusedBy.MaxConnectionsPerAddr {
		t.Fatalf("after %d handshakes from one address: %+v", n, st)
	}
	t.Logf("%d handshakes from one address: %d admitted, %d refused", n, st.ConnectionsAccepted, st.ConnectionsRefused)
	// A refused connection is told why.
	var ae *quic.ApplicationError
	for _, qc := range conns {
		select {
		case <-qc.Context().Done():
			if errors.As(context.Cause(qc.Context()), &ae) {
				break
			}
			continue
		default:
			continue
		}
		break
	}
	if ae == nil || ae.ErrorCode != quic.ApplicationErrorCode(LimitExceeded) || ae.ErrorMessage != RefusedMaxConnectionsPerAddr {
		t.Errorf("a refused connection was closed with %v, want LIMIT_EXCEEDED %s", ae, RefusedMaxConnectionsPerAddr)
	}
	if lines := strings.Count(logs.String(), "weida: refusing connection"); lines < 1 || lines > 2 {
		t.Errorf("%d refusal lines logged for %d refusals, want them rate-limited", lines, st.ConnectionsRefused)
	}

	// The subscriber dials from 127.0.0.1, another address.
	start := time.Now()
	dctx, dcancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer dcancel()
	s, err := Dial(dctx, pinnedURL(l, "/open"), DialConfig{})
	if err != nil {
		t.Fatalf("subscriber from another address: %v", err)
	}
	defer s.Close()
	if err := s.Subscribe(dctx, "#"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the subscription", func() bool { return p.Subscribers() == 1 })
	if _, err := p.Publish(dctx, Message{Topic: "t", Payload: []byte("hi")}); err != nil {
		t.Fatal(err)
	}
	m, err := s.Receive(dctx)
	if err != nil || string(m.Payload) != "hi" {
		t.Fatalf("Receive: %q, %v", m.Payload, err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the subscriber took %s to connect and receive", took)
	}
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
