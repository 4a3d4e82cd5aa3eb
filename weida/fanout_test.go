package weida

import (
	"context"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"weida.dev/connector/weida/topic"
)

// fakeListener is a Listener with its subscription table and fan-out but
// no QUIC: fakeConn adds negotiated connections whose queues are only
// inspected, never written.
func fakeListener(budget int64) *Listener {
	limits, _ := Limits{SubscriberBufferBytes: budget}.withDefaults(true)
	return &Listener{
		limits:  limits,
		paths:   make(map[string]*pathState),
		conns:   make(map[*serverConn]struct{}),
		perPeer: make(map[string]int),
	}
}

func fakeConn(l *Listener, peerMaxHeader uint64) *serverConn {
	sc := &serverConn{l: l, subs: make(map[subKey]struct{}), paths: make(map[string]*connPath)}
	sc.c = &conn{helloDone: make(chan struct{}), agreed: agreed{sendMaxHeaderBytes: peerMaxHeader}}
	close(sc.c.helloDone)
	sc.q.init(l.limits.SlowConsumerAfter)
	l.conns[sc] = struct{}{}
	return sc
}

func (sc *serverConn) queued() int {
	sc.q.mu.Lock()
	defer sc.q.mu.Unlock()
	return len(sc.q.items) - sc.q.head
}

func segments(t *rapid.T, label string, alphabet []string) string {
	n := rapid.IntRange(1, 4).Draw(t, label+"-len")
	segs := make([]string, n)
	for i := range segs {
		segs[i] = rapid.SampledFrom(alphabet).Draw(t, label)
	}
	return strings.Join(segs, ".")
}

func genFilter(t *rapid.T) string {
	if rapid.IntRange(0, 9).Draw(t, "empty") == 0 {
		return ""
	}
	f := segments(t, "fseg", []string{"a", "b", "*", ""})
	if rapid.Bool().Draw(t, "hash") {
		f += ".#"
	}
	return f
}

// TestFanoutProperty: whatever the subscriptions, a publish matches each
// connection holding a matching filter on the publisher's path exactly
// once, queues one copy for each, and the counters agree with a model
// that scans every filter with topic.Match.
func TestFanoutProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		l := fakeListener(1 << 30)
		p, err := l.Publisher("/a")
		if err != nil {
			t.Fatal(err)
		}
		nconns := rapid.IntRange(1, 5).Draw(t, "conns")
		conns := make([]*serverConn, nconns)
		model := make([]map[subKey]bool, nconns)
		for i := range conns {
			conns[i] = fakeConn(l, 16384)
			model[i] = map[subKey]bool{}
		}
		for range rapid.IntRange(0, 40).Draw(t, "ops") {
			i := rapid.IntRange(0, nconns-1).Draw(t, "conn")
			k := subKey{rapid.SampledFrom([]string{"/a", "/b"}).Draw(t, "path"), genFilter(t)}
			if rapid.IntRange(0, 3).Draw(t, "unsub") == 0 {
				conns[i].unsubscribe(k.path, k.filter)
				delete(model[i], k)
			} else {
				if _, ok := conns[i].subscribe(k.path, k.filter); !ok {
					t.Fatalf("subscribe %v refused under the limit", k)
				}
				model[i][k] = true
			}
		}
		total, onA := 0, 0
		for i := range conns {
			total += len(model[i])
			for k := range model[i] {
				if k.path == "/a" {
					onA++
					break
				}
			}
		}
		if got := l.Stats().Subscriptions; got != int64(total) {
			t.Fatalf("Subscriptions = %d, model %d", got, total)
		}
		if got := p.Subscribers(); got != onA {
			t.Fatalf("Subscribers = %d, model %d", got, onA)
		}
		tp := segments(t, "tseg", []string{"a", "b", "*", "#", ""})
		before := make([]int, nconns)
		want := 0
		wantConn := make([]bool, nconns)
		for i := range conns {
			before[i] = conns[i].queued()
			for k := range model[i] {
				if k.path == "/a" && topic.Match(k.filter, tp) {
					wantConn[i] = true
				}
			}
			if wantConn[i] {
				want++
			}
		}
		r, err := p.Publish(context.Background(), Message{Topic: tp, Payload: []byte("x")})
		if err != nil {
			t.Fatal(err)
		}
		if r != (Result{Matched: want, Queued: want}) {
			t.Fatalf("Publish(%q) = %+v, model matches %d connections", tp, r, want)
		}
		for i := range conns {
			if got, w := conns[i].queued()-before[i], map[bool]int{true: 1}[wantConn[i]]; got != w {
				t.Fatalf("connection %d got %d copies of %q, want %d", i, got, tp, w)
			}
		}
		// A connection's end drops all of its subscriptions.
		for i := range conns {
			conns[i].dropSubscriptions()
		}
		if l.Stats().Subscriptions != 0 || p.Subscribers() != 0 {
			t.Fatalf("after the connections ended: %+v, %d subscribers", l.Stats(), p.Subscribers())
		}
		p.Close()
		if len(l.paths) != 0 {
			t.Fatalf("paths left behind: %v", l.paths)
		}
	})
}

// TestBudget: the per-subscriber budget drops the arriving copy for that
// subscriber alone, and a header over the peer's max_header_bytes is
// dropped and counted.
func TestBudget(t *testing.T) {
	msg := Message{Topic: "t", Payload: make([]byte, 100)}
	l := fakeListener(1000)
	p, _ := l.Publisher("/a")
	slow, other, tiny := fakeConn(l, 16384), fakeConn(l, 16384), fakeConn(l, 8)
	for _, sc := range []*serverConn{slow, other, tiny} {
		sc.subscribe("/a", "")
	}
	f, _ := l.frames.get("/a", &msg)
	fits := int(1000 / f.queuedCharge())
	f.release()
	for i := range fits {
		if r, _ := p.Publish(context.Background(), msg); r != (Result{Matched: 3, Queued: 2, Dropped: 1}) {
			t.Fatalf("publish %d: %+v", i, r)
		}
	}
	// The other subscriber's writer catches up; the slow one's does not.
	other.q.close(&l.stats)
	other.q = sendQueue{}
	other.q.init(l.limits.SlowConsumerAfter)
	if r, _ := p.Publish(context.Background(), msg); r != (Result{Matched: 3, Queued: 1, Dropped: 2}) {
		t.Fatalf("publish with the slow subscriber full: %+v", r)
	}
	st := l.Stats()
	if st.Dropped.HeaderTooLarge != uint64(fits+1) || st.Dropped.BufferFull != 1 {
		t.Errorf("Dropped = %+v, want %d HeaderTooLarge and 1 BufferFull", st.Dropped, fits+1)
	}
	if slow.queued() != fits || other.queued() != 1 {
		t.Errorf("queued %d and %d, want %d and 1", slow.queued(), other.queued(), fits)
	}
}
