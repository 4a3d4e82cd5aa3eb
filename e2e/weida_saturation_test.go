package e2e

// Saturation (issue 21, docs/RELIABILITY.md "Saturation"): one weida
// endpoint offered more copies than the machine can send, with the weida
// package directly. Every copy is received or counted by reason, no
// reading subscriber is closed, and the process stays within the memory
// bound the endpoint documents.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"weida.dev/connector/weida"
)

// rssBytes is the process's resident set, from /proc/self/status.
func rssBytes(t *testing.T) int64 { return rssOf(t, 0) }

// rssOf is process pid's resident set (0: this process), from
// /proc/PID/status.
func rssOf(t *testing.T, pid int) int64 {
	path := "/proc/self/status"
	if pid != 0 {
		path = fmt.Sprintf("/proc/%d/status", pid)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading RSS: %v", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if f := bytes.Fields(sc.Bytes()); len(f) >= 2 && string(f[0]) == "VmRSS:" {
			kb, err := strconv.ParseInt(string(f[1]), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS %q: %v", f[1], err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS in %s", path)
	return 0
}

// TestWeidaSaturation publishes flat out from two goroutines to a number
// of reading subscribers on one endpoint for a while, then waits for the
// queues to drain and accounts for every copy matched. By default it is a
// smoke run (4 subscribers, 1.5 s); WEIDA_SATURATION=1 makes it the heavy
// run (WEIDA_SATURATION_SUBSCRIBERS, default 300, for
// WEIDA_SATURATION_DURATION, default 10 s), which is what PERFORMANCE.md
// records; WEIDA_SATURATION_IDLE_TIMEOUT overrides the listener's 2 s
// idle timeout. Nothing here asserts a rate: the numbers are logged.
func TestWeidaSaturation(t *testing.T) {
	subs, dur := 4, 1500*time.Millisecond
	if os.Getenv("WEIDA_SATURATION") == "1" {
		subs = envInt(t, "WEIDA_SATURATION_SUBSCRIBERS", 300)
		dur = envDuration(t, "WEIDA_SATURATION_DURATION", 10*time.Second)
	}
	const (
		budget  = 1 << 20 // SubscriberBufferBytes
		credit  = 256     // each subscriber's MaxConcurrentUniStreams
		payload = 256
	)
	ctx, cancel := context.WithTimeout(t.Context(), dur+3*time.Minute)
	defer cancel()
	// WEIDA_SATURATION_IDLE_TIMEOUT sets the listener's idle timeout
	// (default 2 s), to tell starvation of the whole process from the
	// endpoint's own doing.
	var idle time.Duration
	if os.Getenv("WEIDA_SATURATION_IDLE_TIMEOUT") != "" {
		idle = envDuration(t, "WEIDA_SATURATION_IDLE_TIMEOUT", 0)
	}
	l, err := weida.Listen(ctx, "127.0.0.1:0", weida.ListenConfig{Limits: weida.Limits{SubscriberBufferBytes: budget, IdleTimeout: idle,
		// Every subscriber dials from 127.0.0.1.
		MaxConnectionsPerAddress: max(subs, weida.DefaultMaxConnectionsPerAddress)}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	pub, err := l.Publisher("/sat")
	if err != nil {
		t.Fatal(err)
	}
	var lostAfterQueue, unconfirmed atomic.Int64
	pub.OnCopiesLost(func(n int) { lostAfterQueue.Add(int64(n)) })
	pub.CountCopiesUnconfirmed(func(u weida.UnconfirmedCopies) { unconfirmed.Add(int64(u.Len())) })
	url := fmt.Sprintf("weida://%s@%s/sat", l.Fingerprint(), l.Addr())
	ss := make([]*weida.Subscriber, subs)
	for i := range ss {
		s, err := weida.Dial(ctx, url, weida.DialConfig{Limits: weida.Limits{MaxConcurrentUniStreams: credit}})
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		defer s.Close()
		if err := s.Subscribe(ctx, ""); err != nil {
			t.Fatal(err)
		}
		ss[i] = s
	}
	for pub.Subscribers() < subs {
		if ctx.Err() != nil {
			t.Fatalf("only %d of %d subscriptions arrived", pub.Subscribers(), subs)
		}
		time.Sleep(5 * time.Millisecond)
	}
	var received atomic.Int64
	rctx, stopReading := context.WithCancel(ctx)
	var readers sync.WaitGroup
	for _, s := range ss {
		readers.Go(func() {
			for {
				if _, err := s.Receive(rctx); err != nil {
					return
				}
				received.Add(1)
			}
		})
	}
	rssBase := rssBytes(t)
	var peak atomic.Int64
	sampleDone := make(chan struct{})
	go func() {
		defer close(sampleDone)
		for rctx.Err() == nil {
			if r := rssBytes(t); r > peak.Load() {
				peak.Store(r)
			}
			select {
			case <-rctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()

	var matched, queued, dropped, closing atomic.Int64
	msg := weida.Message{Topic: "sat.t", Payload: make([]byte, payload)}
	pctx, stopPublishing := context.WithTimeout(ctx, dur)
	var pubs sync.WaitGroup
	start := time.Now()
	for range 2 {
		pubs.Go(func() {
			for pctx.Err() == nil {
				r, err := pub.Publish(ctx, msg)
				if err != nil {
					t.Errorf("publish: %v", err)
					return
				}
				matched.Add(int64(r.Matched))
				queued.Add(int64(r.Queued))
				dropped.Add(int64(r.Dropped))
				closing.Add(int64(r.Closing))
			}
		})
	}
	pubs.Wait()
	stopPublishing()
	offeredFor := time.Since(start)

	// Drain: every queued copy ends received, refused by its subscriber,
	// lost with its connection (OnCopiesLost), unconfirmed, or unread in
	// a subscriber whose connection ended.
	// A subscriber whose connection ended counts what had arrived unread.
	unreadAtClose := func() (n int64) {
		for _, s := range ss {
			n += int64(s.Stats().DroppedUnread)
		}
		return n
	}
	accounted := func() int64 {
		st := l.Stats()
		return received.Load() + int64(st.CopiesRefused) + lostAfterQueue.Load() + unconfirmed.Load() + unreadAtClose()
	}
	drainBy := time.Now().Add(time.Minute)
	for accounted() < queued.Load() && time.Now().Before(drainBy) {
		time.Sleep(20 * time.Millisecond)
	}
	if accounted() < queued.Load() {
		// For whoever looks into it: what every goroutine was doing.
		if d := os.Getenv("WEIDA_SATURATION_STACKS"); d != "" {
			if f, err := os.Create(d); err == nil {
				_ = pprof.Lookup("goroutine").WriteTo(f, 1)
				_ = f.Close()
			}
		}
		t.Logf("not drained after a minute: written %d, received %d", l.Stats().CopiesWritten, received.Load())
	}
	stopReading()
	readers.Wait()
	<-sampleDone
	st := l.Stats()
	closed := 0
	var unread uint64
	causes := map[string]int{}
	for _, s := range ss {
		if err := s.Err(); err != nil {
			closed++
			causes[err.Error()]++
		}
		unread += s.Stats().DroppedUnread
	}
	for cause, n := range causes {
		t.Logf("%d subscribers ended: %s", n, cause)
	}
	t.Logf("%d subscribers offered copies for %v (load average %s): published %d, matched %d, queued %d (%.0f copies/s), received %d, "+
		"dropped at publish %d (buffer full %d, header too large %d, closing %d), lost after queueing %d, unconfirmed %d, refused %d, unread at close %d; "+
		"RSS %d MiB before, peak %d MiB; slow consumers closed %d",
		subs, offeredFor.Round(time.Millisecond), loadAverage(), st.Published, matched.Load(), queued.Load(),
		float64(received.Load())/offeredFor.Seconds(), received.Load(),
		dropped.Load(), st.Dropped.BufferFull, st.Dropped.HeaderTooLarge, closing.Load(), lostAfterQueue.Load(),
		unconfirmed.Load(), st.CopiesRefused, unread, rssBase>>20, peak.Load()>>20, st.SlowConsumersClosed)

	if want := int64(st.Published) * int64(subs); matched.Load() != want {
		t.Errorf("matched %d copies, want %d: a subscription went missing", matched.Load(), want)
	}
	if matched.Load() != queued.Load()+dropped.Load() {
		t.Errorf("matched %d != queued %d + dropped %d", matched.Load(), queued.Load(), dropped.Load())
	}
	// Unconfirmed copies are a bound (some of them arrived), so the sum
	// may exceed what was queued; it must not fall short.
	if un := queued.Load() - accounted(); un > 0 {
		t.Errorf("%d copies queued are neither received nor counted (queued %d, accounted %d)", un, queued.Load(), accounted())
	}
	if closed != 0 || st.Connections != subs || st.SlowConsumersClosed != 0 {
		t.Errorf("%d reading subscribers closed (listener holds %d connections, %d closed as slow)", closed, st.Connections, st.SlowConsumersClosed)
	}
	// The endpoint's bound (docs/WEIDA.md "Memory"): per subscriber its
	// buffer and what QUIC may hold for it; per subscriber here also its
	// own side, which the same process runs: its stream credit of unread
	// copies. 64 MiB covers the runtime's slack around the base.
	perSub := int64(budget) + weida.ParkedBytesPerConnection + credit*4096
	if bound := rssBase + int64(subs)*perSub + 64<<20; peak.Load() > bound {
		t.Errorf("peak RSS %d MiB over the bound %d MiB", peak.Load()>>20, bound>>20)
	}
}
