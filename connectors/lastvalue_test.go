package connectors_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"pgregory.net/rapid"

	"weida.dev/connector/connectors"
	"weida.dev/connector/internal/proccpu"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
	"weida.dev/connector/weida/topic"
)

// feedSource is a Source fed by the test: each message sent on in is
// returned by Read, and its settlement is sent on acked.
type feedSource struct {
	in    chan *connectors.Message
	acked chan error
}

func newFeedSource() *feedSource {
	return &feedSource{in: make(chan *connectors.Message), acked: make(chan error, 1)}
}

func (s *feedSource) Start(context.Context, []string) error { return nil }
func (s *feedSource) Close(context.Context) error           { return nil }
func (s *feedSource) Read(ctx context.Context) (*connectors.Message, connectors.AckFunc, error) {
	select {
	case m := <-s.in:
		return m, func(err error) { s.acked <- err }, nil
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
}

// send hands m to the bridge and waits until it is settled.
func (s *feedSource) send(t interface{ Fatalf(string, ...any) }, m *connectors.Message) {
	s.in <- m
	if err := <-s.acked; err != nil {
		t.Fatalf("message %q settled with %v", m.Topic, err)
	}
}

// lvBridge runs an inbound MQTT bridge of every topic ("#") onto path of l
// with the given cache, fed by the returned source, until the test ends.
func lvBridge(t testing.TB, l *weida.Listener, path string, lv connectors.LastValue) (*lvRig, *feedSource, *connectors.Metrics) {
	return lvBridgeWith(t, l, path, lv, lvOptions{})
}

// lvOptions are what lvBridgeWith adds to lvBridge.
type lvOptions struct {
	maxMessageBytes int
	now             func() time.Time      // nil: time.Now
	report          *connectors.StateFunc // set to the source's StateFunc once the bridge built it
}

func lvBridgeWith(t testing.TB, l *weida.Listener, path string, lv connectors.LastValue, o lvOptions) (*lvRig, *feedSource, *connectors.Metrics) {
	pub, err := l.Publisher(path)
	if err != nil {
		t.Fatal(err)
	}
	pol := policy.MQTTLevelsV1()
	w, err := pol.ConvertFilter("#")
	if err != nil {
		t.Fatal(err)
	}
	src := newFeedSource()
	m := connectors.NewMetrics(prometheus.NewRegistry())
	built := make(chan struct{})
	b := connectors.NewInbound(connectors.Spec{
		Name: "lv", Protocol: policy.MQTT, Direction: policy.Inbound, Policy: pol,
		Routes:          []connectors.Route{{Name: "all", Foreign: "#", Weida: w}},
		LastValue:       lv,
		MaxMessageBytes: o.maxMessageBytes,
	}, func(report connectors.StateFunc) (connectors.Source, error) {
		if o.report != nil {
			*o.report = report
		}
		close(built)
		return src, nil
	}, pub, connectors.Deps{Metrics: m, Now: o.now})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = b.Run(ctx) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		pub.Close()
	})
	<-built
	return &lvRig{Bridge: b, pub: pub}, src, m
}

// lvRig is a bridge and the publisher path it publishes on.
type lvRig struct {
	*connectors.Bridge
	pub *weida.Publisher
}

// probeTopic is published straight on the path, bypassing the cache, to
// wait for a replay: a Publish on the path waits for any replay under way.
const probeTopic = "zz.probe.zz.zz"

// sync returns once every SUBSCRIBE the path has begun has been replayed.
func (r *lvRig) sync(t interface{ Fatalf(string, ...any) }) {
	if _, err := r.pub.Publish(context.Background(), weida.Message{Topic: probeTopic}); err != nil {
		t.Fatalf("probe: %v", err)
	}
}

func lvListen(t testing.TB) *weida.Listener {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := weida.Listen(ctx, "127.0.0.1:0", weida.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// lvSubscribe dials path on l, subscribes filter and returns the messages
// replayed to it: once b's path has the new subscriber (its connections on
// the path stay open until the test, or the rapid check, ends) and its
// replay is queued, it checks that the listener queued want more replayed
// copies than before, and reads that many.
func lvSubscribe(t interface {
	Fatalf(string, ...any)
	Cleanup(func())
}, l *weida.Listener, b *lvRig, path, filter string, want int) map[string]string {
	got := map[string]string{}
	for tp, m := range lvSubscribeCopies(t, l, b, path, filter, want) {
		got[tp] = string(m.Payload)
	}
	return got
}

// lvSubscribeCopies is lvSubscribe returning the copies themselves, with
// their replay marks.
func lvSubscribeCopies(t interface {
	Fatalf(string, ...any)
	Cleanup(func())
}, l *weida.Listener, b *lvRig, path, filter string, want int) map[string]weida.Message {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	url := fmt.Sprintf("weida://%s@%s%s", l.Fingerprint(), l.Addr(), path)
	open := l.Stats().Connections
	s, err := weida.Dial(ctx, url, weida.DialConfig{})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	// The close waits for the listener to see it: a connection of an
	// earlier rapid check that closes while a later one waits below would
	// move the subscriber count and end that wait before its replay.
	t.Cleanup(func() {
		s.Close()
		deadline := time.Now().Add(10 * time.Second)
		for l.Stats().Connections > open && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
	})
	before := l.Stats()
	subs := b.Status().Counters.Subscribers
	if err := s.Subscribe(ctx, filter); err != nil {
		t.Fatalf("Subscribe(%q): %v", filter, err)
	}
	// The listener's own subscription count would also move when a
	// connection of an earlier check closes.
	for b.Status().Counters.Subscribers == subs {
		if ctx.Err() != nil {
			t.Fatalf("the subscription to %q never arrived", filter)
		}
		time.Sleep(time.Millisecond)
	}
	b.sync(t) // the path's subscriber count moves before the replay
	if got := l.Stats().CopiesReplayed - before.CopiesReplayed; got != uint64(want) {
		t.Fatalf("SUBSCRIBE %q: %d copies replayed, want %d", filter, got, want)
	}
	got := map[string]weida.Message{}
	for len(got) < want {
		m, err := s.Receive(ctx)
		if err != nil {
			t.Fatalf("Receive: %v", err)
		}
		if m.Topic == probeTopic {
			continue
		}
		if _, dup := got[m.Topic]; dup {
			t.Fatalf("SUBSCRIBE %q: %q replayed twice", filter, m.Topic)
		}
		got[m.Topic] = m
	}
	return got
}

// TestLastValueReplayProperty runs random publishes (retained or not),
// deletions (empty retained messages) and subscriptions through a bridge
// keeping a cache of every message: what each new subscription receives
// on subscribe is the last value of each topic its filter matches at that
// moment. It adds what makes the cache a mirror of its source: updates
// dropped as too large or refused by weida (the older value goes too),
// values with an expiry and a cache maxAge against a clock the test moves,
// and the source going down and up: while it is down every replayed copy
// is marked stale (or, with whenSourceDown: withhold, none is replayed),
// and after orphanAfter down the cache is empty. Every copy is marked
// replayed, with its age on the test's clock.
func TestLastValueReplayProperty(t *testing.T) {
	l := lvListen(t)
	var paths atomic.Int64
	segs := []string{"a", "b", "c"}
	genTopic := func(t *rapid.T) []string {
		return rapid.SliceOfN(rapid.SampledFrom(segs), 1, 3).Draw(t, "topic")
	}
	const maxMessage = 64
	type value struct {
		payload     string
		at, expires time.Time // expires zero: never
	}
	rapid.Check(t, func(rt *rapid.T) {
		path := fmt.Sprintf("/prop%d", paths.Add(1))
		var clock atomic.Int64
		clock.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
		now := func() time.Time { return time.Unix(0, clock.Load()) }
		cfg := connectors.LastValue{Mode: connectors.LastValueAll}
		if rapid.Bool().Draw(rt, "maxAge") {
			cfg.MaxAge = time.Duration(rapid.IntRange(1, 6).Draw(rt, "maxAgeSeconds")) * time.Second
		}
		if rapid.Bool().Draw(rt, "withhold") {
			cfg.WhenSourceDown = connectors.LastValueWithhold
		}
		if rapid.Bool().Draw(rt, "orphan") {
			// An hour of the test's clock: the cache's own timer, on the
			// real clock, does not fire within a check.
			cfg.OrphanAfter = time.Hour
		}
		var report connectors.StateFunc
		b, src, _ := lvBridgeWith(t, l, path, cfg, lvOptions{maxMessageBytes: maxMessage, now: now, report: &report})
		up := rapid.Bool().Draw(rt, "upAtStart")
		var downSince time.Time
		if up {
			report(connectors.ConnState{Up: true, Reason: "Connected"})
		} else {
			downSince = now()
		}
		ref := map[string]value{} // weida topic -> value
		expire := func() {
			for tp, v := range ref {
				if !v.expires.IsZero() && !now().Before(v.expires) {
					delete(ref, tp)
				}
			}
			if !up && cfg.OrphanAfter > 0 && now().Sub(downSince) >= cfg.OrphanAfter {
				clear(ref)
			}
		}
		set := func(tp, p string, expires time.Time) {
			v := value{payload: p, at: now(), expires: expires}
			if cfg.MaxAge > 0 && (v.expires.IsZero() || v.at.Add(cfg.MaxAge).Before(v.expires)) {
				v.expires = v.at.Add(cfg.MaxAge)
			}
			ref[tp] = v
		}
		var withheld uint64
		for i := range rapid.IntRange(1, 30).Draw(rt, "ops") {
			switch rapid.IntRange(0, 9).Draw(rt, "op") {
			case 0, 1, 2:
				segs := genTopic(rt)
				p := fmt.Sprintf("v%d", i)
				src.send(rt, &connectors.Message{Topic: strings.Join(segs, "/"), Payload: []byte(p), Retained: rapid.Bool().Draw(rt, "retained")})
				set(strings.Join(segs, "."), p, time.Time{})
			case 3:
				segs := genTopic(rt)
				src.send(rt, &connectors.Message{Topic: strings.Join(segs, "/"), Retained: true})
				delete(ref, strings.Join(segs, "."))
			case 4:
				// Dropped: over maxMessageBytes, or with a content type
				// weida refuses. The broker holds it, so the older value
				// must not be replayed.
				segs := genTopic(rt)
				m := &connectors.Message{Topic: strings.Join(segs, "/"), Payload: make([]byte, maxMessage+1), Retained: true}
				if rapid.Bool().Draw(rt, "refused") {
					m.Payload, m.ContentType = []byte("x"), strings.Repeat("c", 300)
				}
				src.send(rt, m)
				delete(ref, strings.Join(segs, "."))
			case 5:
				// A value with an expiry, possibly already passed.
				segs := genTopic(rt)
				p := fmt.Sprintf("e%d", i)
				exp := now().Add(time.Duration(rapid.IntRange(-1, 5).Draw(rt, "expirySeconds")) * time.Second)
				src.send(rt, &connectors.Message{Topic: strings.Join(segs, "/"), Payload: []byte(p), Retained: true, ExpiresUnixNano: exp.UnixNano()})
				if now().Before(exp) {
					set(strings.Join(segs, "."), p, exp)
				} else {
					delete(ref, strings.Join(segs, "."))
				}
			case 6:
				d := time.Duration(rapid.IntRange(1, 3).Draw(rt, "advanceSeconds")) * time.Second
				if rapid.IntRange(0, 4).Draw(rt, "long") == 0 {
					d = 2 * time.Hour
				}
				clock.Add(int64(d))
			case 7:
				if up = !up; up {
					report(connectors.ConnState{Up: true, Reason: "Connected"})
				} else {
					report(connectors.ConnState{Reason: "ConnectionLost"})
					downSince = now()
				}
			default:
				f := rapid.SliceOfN(rapid.SampledFrom([]string{"a", "b", "*"}), 1, 3).Draw(rt, "filter")
				if rapid.Bool().Draw(rt, "hash") {
					f = append(f, "#")
				}
				filter := strings.Join(f, ".")
				expire()
				want := map[string]string{}
				for tp, v := range ref {
					if topic.Match(filter, tp) {
						want[tp] = v.payload
					}
				}
				n := len(want)
				if !up && cfg.WhenSourceDown == connectors.LastValueWithhold {
					withheld += uint64(n)
					want = map[string]string{}
				}
				copies := lvSubscribeCopies(rt, l, b, path, filter, len(want))
				got := map[string]string{}
				for tp, m := range copies {
					got[tp] = string(m.Payload)
					if r := m.Replay; !r.Replayed || r.Stale != !up || !r.HasAge || r.Age != now().Sub(ref[tp].at).Truncate(time.Millisecond) {
						rt.Fatalf("SUBSCRIBE %q: %s replayed with marks %+v; want replayed, stale %v, age %v",
							filter, tp, r, !up, now().Sub(ref[tp].at))
					}
				}
				if !maps.Equal(got, want) {
					rt.Fatalf("SUBSCRIBE %q replayed %v, want %v (source up: %v)", filter, got, want, up)
				}
				if lv := b.Status().Counters.LastValue; lv.Withheld != withheld || lv.Stale == up {
					rt.Fatalf("status %+v: want %d withheld, stale %v", lv, withheld, !up)
				}
			}
		}
	})
}

// TestLastValueBounds fills a small cache past its bounds: it keeps its
// size, counts every eviction by reason, and replays only what it holds.
func TestLastValueBounds(t *testing.T) {
	l := lvListen(t)
	b, src, m := lvBridge(t, l, "/bounds", connectors.LastValue{Mode: connectors.LastValueRetained, MaxTopics: 10, MaxBytes: 2000})
	// Not retained: mode retained does not cache it.
	src.send(t, &connectors.Message{Topic: "live/x", Payload: []byte("x")})
	for i := range 100 {
		src.send(t, &connectors.Message{Topic: fmt.Sprintf("t/%d", i), Payload: []byte("v"), Retained: true})
	}
	lv := b.Status().Counters.LastValue
	if lv == nil || lv.Entries != 10 || lv.Evicted[connectors.EvictMaxTopics] != 90 {
		t.Fatalf("after 100 topics into 10: %+v", lv)
	}
	// Ten 150-byte values (each charged 64 bytes more) exceed 2000 bytes.
	big := strings.Repeat("p", 150)
	for i := range 10 {
		src.send(t, &connectors.Message{Topic: fmt.Sprintf("big/%d", i), Payload: []byte(big), Retained: true})
	}
	lv = b.Status().Counters.LastValue
	if lv.Bytes > 2000 || lv.Evicted[connectors.EvictMaxBytes] == 0 {
		t.Fatalf("after ten large values: %+v", lv)
	}
	// One value larger than the whole cache replaces nothing: its
	// topic's older value goes too, so no stale value is replayed.
	src.send(t, &connectors.Message{Topic: "big/9", Payload: make([]byte, 3000), Retained: true})
	lv = b.Status().Counters.LastValue
	if lv.Evicted[connectors.EvictTooLarge] != 1 {
		t.Fatalf("after a value over maxBytes: %+v", lv)
	}
	got := lvSubscribe(t, l, b, "/bounds", "big.*", lv.Entries)
	if _, ok := got["big.9"]; ok || len(got) != lv.Entries {
		t.Fatalf("replayed %v with %d entries cached", slices.Collect(maps.Keys(got)), lv.Entries)
	}
	evicted := lv.Evicted[connectors.EvictMaxTopics] + lv.Evicted[connectors.EvictMaxBytes] + lv.Evicted[connectors.EvictTooLarge]
	var metric float64
	for _, r := range []string{connectors.EvictMaxTopics, connectors.EvictMaxBytes, connectors.EvictTooLarge} {
		metric += testutil.ToFloat64(m.LastValueEvictions.WithLabelValues("lv", r))
	}
	if metric != float64(evicted) {
		t.Fatalf("evictions: metric %v, status %d", metric, evicted)
	}
	if g := testutil.ToFloat64(m.LastValueEntries.WithLabelValues("lv")); g != float64(lv.Entries) {
		t.Fatalf("entries gauge %v, status %d", g, lv.Entries)
	}
	if r := testutil.ToFloat64(m.LastValueReplayed.WithLabelValues("lv")); r != float64(lv.Entries) {
		t.Fatalf("replayed metric %v, want %d", r, lv.Entries)
	}
}

// BenchmarkLastValueReplay measures replaying 10,000 cached topics to one
// new subscriber, from SUBSCRIBE to the last copy read; docs/PERFORMANCE.md
// records it with the process CPU time it takes.
func BenchmarkLastValueReplay(b *testing.B) {
	const topics = 10000
	l := lvListen(b)
	_, src, _ := lvBridge(b, l, "/bench", connectors.LastValue{Mode: connectors.LastValueAll, MaxTopics: topics})
	payload := make([]byte, 100)
	for i := range topics {
		src.send(b, &connectors.Message{Topic: fmt.Sprintf("site/room-%d/metric-%d", i/100, i%100), Payload: payload})
	}
	ctx := context.Background()
	url := fmt.Sprintf("weida://%s@%s/bench", l.Fingerprint(), l.Addr())
	var cpu time.Duration
	b.ReportAllocs()
	for b.Loop() {
		s, err := weida.Dial(ctx, url, weida.DialConfig{})
		if err != nil {
			b.Fatal(err)
		}
		c0 := proccpu.Self()
		if err := s.Subscribe(ctx, "site.#"); err != nil {
			b.Fatal(err)
		}
		for range topics {
			if _, err := s.Receive(ctx); err != nil {
				b.Fatal(err)
			}
		}
		cpu += proccpu.Self() - c0
		s.Close()
	}
	b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "cpu-ms/op")
}

// onceSource delivers one retained message on its first Read, then ends
// the attempt, so that the unit is down with a value cached.
type onceSource struct {
	msg  *connectors.Message // nil: deliver nothing
	done chan struct{}
	once sync.Once
}

func (s *onceSource) Start(context.Context, []string) error { return nil }
func (s *onceSource) Close(context.Context) error {
	if s.done != nil {
		s.once.Do(func() { close(s.done) })
	}
	return nil
}
func (s *onceSource) Read(ctx context.Context) (*connectors.Message, connectors.AckFunc, error) {
	if m := s.msg; m != nil {
		s.msg = nil
		return m, func(error) {}, nil
	}
	if s.done == nil { // the first source: fail once its message is read
		return nil, nil, connectors.Retryable("ConnectionLost", errors.New("test: connection lost"))
	}
	select {
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	case <-s.done:
		return nil, nil, connectors.ErrClosed
	}
}

// TestLastValueSurvivesReload: the cache of a unit that a reload restarts
// with its configuration unchanged is kept; a changed unit starts empty.
func TestLastValueSurvivesReload(t *testing.T) {
	m := connectors.NewMetrics(prometheus.NewRegistry())
	rt := connectors.NewRuntime(connectors.Deps{Metrics: m, Backoff: func(int) time.Duration { return time.Hour }})
	t.Cleanup(rt.Stop)
	var built atomic.Int32
	factory := func(connectors.StateFunc) (connectors.Source, error) {
		if built.Add(1) == 1 {
			return &onceSource{msg: &connectors.Message{Topic: "in.a", Payload: []byte("v1"), Retained: true}}, nil
		}
		return &onceSource{done: make(chan struct{})}, nil
	}
	p := policy.NATSTokensV1()
	wf, err := p.ConvertFilter("in.*")
	if err != nil {
		t.Fatal(err)
	}
	unit := func(rev string) connectors.Unit {
		return connectors.Unit{
			Spec: connectors.Spec{
				Name: "lv", Protocol: policy.NATS, Direction: policy.Inbound, Policy: p,
				Routes:    []connectors.Route{{Name: "r", Foreign: "in.*", Weida: wf}},
				LastValue: connectors.LastValue{Mode: connectors.LastValueAll},
			},
			Revision: rev, Listen: "127.0.0.1:0", Path: "/lv", NewSource: factory,
		}
	}
	entries := func() int {
		for _, s := range rt.Statuses() {
			if s.Name == "lv" && s.Counters.LastValue != nil {
				return s.Counters.LastValue.Entries
			}
		}
		return -1
	}
	down := func() bool {
		for _, s := range rt.Statuses() {
			if s.Name == "lv" {
				return s.Failure != nil
			}
		}
		return false
	}
	ctx := context.Background()
	if err := rt.Apply(ctx, []connectors.Unit{unit("rev1")}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the value cached and the unit down", func() bool { return entries() == 1 && down() })
	// The reload retries the down unit; its configuration is unchanged.
	if err := rt.Apply(ctx, []connectors.Unit{unit("rev1")}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the unit up again", func() bool { return built.Load() == 2 && !down() })
	if n := entries(); n != 1 {
		t.Fatalf("after a reload of the unchanged unit the cache holds %d topics, want 1", n)
	}
	if err := rt.Apply(ctx, []connectors.Unit{unit("rev2")}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the changed unit started", func() bool { return built.Load() == 3 })
	if n := entries(); n != 0 {
		t.Fatalf("a changed unit kept %d cached topics", n)
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
