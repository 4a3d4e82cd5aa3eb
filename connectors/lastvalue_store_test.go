package connectors_test

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/fxamacker/cbor/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"weida.dev/connector/connectors"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// persistRig runs an inbound bridge of every topic ("#") with a persisted
// cache in mode all, in dir, under the resource name "lv", until stop.
type persistRig struct {
	*lvRig
	src     *feedSource
	metrics *connectors.Metrics
	stop    func()
}

func persistBridge(t *testing.T, l *weida.Listener, dir string, routes ...string) *persistRig {
	t.Helper()
	return persistBridgeLV(t, l, dir, connectors.LastValue{Mode: connectors.LastValueAll}, routes...)
}

func persistBridgeLV(t *testing.T, l *weida.Listener, dir string, lv connectors.LastValue, routes ...string) *persistRig {
	t.Helper()
	if len(routes) == 0 {
		routes = []string{"#"}
	}
	pub, err := l.Publisher("/persist")
	if err != nil {
		t.Fatal(err)
	}
	pol := policy.MQTTLevelsV1()
	var rs []connectors.Route
	for _, r := range routes {
		w, err := pol.ConvertFilter(r)
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, connectors.Route{Name: "r", Foreign: r, Weida: w})
	}
	src := newFeedSource()
	m := connectors.NewMetrics(prometheus.NewRegistry())
	b := connectors.NewInbound(connectors.Spec{
		Name: "lv", Protocol: policy.MQTT, Direction: policy.Inbound, Policy: pol,
		Routes: rs, LastValue: lv, LastValueDir: dir,
	}, func(connectors.StateFunc) (connectors.Source, error) { return src, nil }, pub, connectors.Deps{Metrics: m})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = b.Run(ctx) })
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			pub.Close()
		})
	}
	t.Cleanup(stop)
	return &persistRig{lvRig: &lvRig{Bridge: b, pub: pub}, src: src, metrics: m, stop: stop}
}

func (r *persistRig) failures(reason string) float64 {
	return testutil.ToFloat64(r.metrics.LastValueRestoreFailures.WithLabelValues("lv", reason))
}

func cacheFile(dir string) string { return filepath.Join(dir, "lastvalue", "lv.cbor") }

// TestLastValuePersistRestart: a cache in mode all kept in the state
// directory comes back after a restart, exactly (values, recency for the
// bounds, source sequences); without a file the cache starts empty and
// nothing is counted.
func TestLastValuePersistRestart(t *testing.T) {
	l := lvListen(t)
	dir := t.TempDir()

	// Without the file: empty, nothing counted.
	r := persistBridge(t, l, dir)
	if got := lvSubscribe(t, l, r.lvRig, "/persist", "#", 0); len(got) != 0 {
		t.Fatalf("a first start replayed %v", got)
	}
	for _, reason := range []string{connectors.RestoreUnreadable, connectors.RestoreMalformed, connectors.RestoreOther, connectors.RestoreVersion} {
		if n := r.failures(reason); n != 0 {
			t.Fatalf("no file, yet %v restore failures %q", n, reason)
		}
	}
	r.src.send(t, &connectors.Message{Topic: "a", Payload: []byte("1")})
	r.src.send(t, &connectors.Message{Topic: "b", Payload: []byte("1"), Sequence: 7})
	r.src.send(t, &connectors.Message{Topic: "a", Payload: []byte("2")})
	r.stop()
	if fi, err := os.Stat(cacheFile(dir)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the cache file after a stop: %v, %v", fi, err)
	}

	// With the file: the values are back before anything is bridged.
	r = persistBridge(t, l, dir)
	if got, want := lvSubscribe(t, l, r.lvRig, "/persist", "#", 2), map[string]string{"a": "2", "b": "1"}; !maps.Equal(got, want) {
		t.Fatalf("after a restart replayed %v, want %v", got, want)
	}
	if c := r.Status().Counters.LastValue; c == nil || c.Entries != 2 {
		t.Fatalf("status after restore: %+v", c)
	}
	s := dialPersist(t, l)
	if err := s.Subscribe(context.Background(), "b"); err != nil {
		t.Fatal(err)
	}
	if m, err := s.Receive(context.Background()); err != nil || m.SourceSequence != 7 {
		t.Fatalf("restored b: %+v, %v; want source sequence 7", m, err)
	}
	r.stop()
}

func dialPersist(t *testing.T, l *weida.Listener) *weida.Subscriber {
	t.Helper()
	s, err := weida.Dial(context.Background(), "weida://"+l.Fingerprint()+"@"+l.Addr().String()+"/persist", weida.DialConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestLastValuePersistDamaged: a file that cannot be used (garbage, cut
// short, another configuration's, not a regular file) never stops the
// resource: it is counted by reason, the cache starts empty and bridges,
// and the next save replaces the file with a good one.
func TestLastValuePersistDamaged(t *testing.T) {
	l := lvListen(t)
	dir := t.TempDir()
	r := persistBridge(t, l, dir)
	r.src.send(t, &connectors.Message{Topic: "a", Payload: []byte("1")})
	r.stop()
	good, err := os.ReadFile(cacheFile(dir))
	if err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name   string
		reason string
		damage func(path string)
		routes []string
	}{
		{"garbage", connectors.RestoreMalformed, func(p string) { write(t, p, []byte("not a cache at all")) }, nil},
		{"cut short", connectors.RestoreMalformed, func(p string) { write(t, p, good[:len(good)/2]) }, nil},
		{"empty", connectors.RestoreMalformed, func(p string) { write(t, p, nil) }, nil},
		{"later format", connectors.RestoreVersion, func(p string) {
			b, err := cbor.Marshal(map[int]any{0: 2, 1: "lv", 2: []string{"#"}, 3: []any{}})
			if err != nil {
				t.Fatal(err)
			}
			write(t, p, b)
		}, nil},
		{"other routes", connectors.RestoreOther, func(p string) { write(t, p, good) }, []string{"a/#"}},
		{"a directory", connectors.RestoreUnreadable, func(p string) {
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(p, 0o700); err != nil {
				t.Fatal(err)
			}
		}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.damage(cacheFile(dir))
			r := persistBridge(t, l, dir, c.routes...)
			if got := lvSubscribe(t, l, r.lvRig, "/persist", "#", 0); len(got) != 0 {
				t.Fatalf("a damaged file replayed %v", got)
			}
			if n := r.failures(c.reason); n != 1 {
				t.Fatalf("restore failures %q = %v, want 1", c.reason, n)
			}
			// The resource bridges, and its next save replaces the file.
			r.src.send(t, &connectors.Message{Topic: "a", Payload: []byte("1")})
			r.stop()
			if fi, err := os.Stat(cacheFile(dir)); c.name == "a directory" {
				// A directory is not replaced; remove it for the next case.
				if err != nil || !fi.IsDir() {
					t.Fatalf("the directory: %v, %v", fi, err)
				}
				if err := os.Remove(cacheFile(dir)); err != nil {
					t.Fatal(err)
				}
				write(t, cacheFile(dir), good)
				return
			}
			back := persistBridge(t, l, dir, c.routes...)
			if got := lvSubscribe(t, l, back.lvRig, "/persist", "#", 1); got["a"] != "1" {
				t.Fatalf("after the damaged file was replaced: %v", got)
			}
			back.stop()
		})
	}
}

func write(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestLastValuePersistBounds: a restored cache obeys the bounds it has
// now: with maxTopics lowered, the topics updated longest ago before the
// stop are evicted, and counted, as they would have been live.
func TestLastValuePersistBounds(t *testing.T) {
	l := lvListen(t)
	dir := t.TempDir()
	r := persistBridge(t, l, dir)
	for _, tp := range []string{"a", "b", "c", "a"} { // recency, newest last: b, c, a
		r.src.send(t, &connectors.Message{Topic: tp, Payload: []byte(tp)})
	}
	r.stop()
	r = persistBridgeLV(t, l, dir, connectors.LastValue{Mode: connectors.LastValueAll, MaxTopics: 2})
	if got, want := lvSubscribe(t, l, r.lvRig, "/persist", "#", 2), map[string]string{"a": "a", "c": "c"}; !maps.Equal(got, want) {
		t.Fatalf("restored under maxTopics 2: %v, want %v", got, want)
	}
	if n := testutil.ToFloat64(r.metrics.LastValueEvictions.WithLabelValues("lv", connectors.EvictMaxTopics)); n != 1 {
		t.Fatalf("max-topics evictions = %v, want 1", n)
	}
}
