package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"weida.dev/connector/internal/proccpu"
	"weida.dev/connector/weida"
)

// idleChildEnv makes the test binary, run again by TestIdleSubscribers,
// the listener side: a process of its own, so that its memory and CPU are
// the listener's alone, not mixed with the subscribers'.
const idleChildEnv = "WEIDA_IDLE_LISTENER_CHILD"

// TestIdleSubscribers measures what idle subscribers cost one weida
// endpoint (issue 21): WEIDA_IDLE_SUBSCRIBERS (10,000) subscribers dial a
// listener in a child process and subscribe, nothing is published, and for
// WEIDA_IDLE_WINDOW (30 s) the child's resident memory and CPU time are
// read from /proc: memory per idle subscriber, and the CPU its keep-alives
// cost. Every subscriber must still be connected at the end. The
// listener's connection limits are raised to the count (a connector's
// endpoint keeps weida's default of 1,024). It runs only with
// WEIDA_BENCH=1.
func TestIdleSubscribers(t *testing.T) {
	if os.Getenv(idleChildEnv) == "1" {
		idleListenerChild(t)
		return
	}
	requireBench(t, "to run the idle-subscriber measurement")
	n := envInt(t, "WEIDA_IDLE_SUBSCRIBERS", 10000)
	window := envDuration(t, "WEIDA_IDLE_WINDOW", 30*time.Second)

	cmd := exec.Command(os.Args[0], "-test.run", "^TestIdleSubscribers$", "-test.count=1")
	cmd.Env = append(os.Environ(), idleChildEnv+"=1", "WEIDA_IDLE_SUBSCRIBERS="+strconv.Itoa(n))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); _ = cmd.Wait() })
	lines := bufio.NewScanner(stdout)
	var url string
	for lines.Scan() {
		if u, ok := strings.CutPrefix(lines.Text(), "URL "); ok {
			url = u
			break
		}
	}
	if url == "" {
		t.Fatal("the listener child printed no URL")
	}
	pid := cmd.Process.Pid
	time.Sleep(time.Second)
	base := rssOf(t, pid)

	// Dial in parallel: one at a time, 10,000 handshakes take minutes.
	subs := make([]*weida.Subscriber, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	start := time.Now()
	dctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for range 16 {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				s, err := weida.Dial(dctx, url, weida.DialConfig{})
				if err == nil {
					err = s.Subscribe(dctx, "")
				}
				if err != nil {
					failed.CompareAndSwap(nil, fmt.Errorf("subscriber %d: %w", i, err))
					return
				}
				subs[i] = s
			}
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, s := range subs {
			if s != nil {
				s.Close()
			}
		}
	})
	if err, _ := failed.Load().(error); err != nil {
		t.Fatalf("after %v: %v", time.Since(start).Round(time.Millisecond), err)
	}
	setup := time.Since(start)
	time.Sleep(5 * time.Second) // let the handshakes' garbage go
	cpu0, own0, at0 := cpuTime(t, pid), proccpu.Self(), time.Now()
	peak := rssOf(t, pid)
	for end := at0.Add(window); time.Now().Before(end); time.Sleep(time.Second) {
		peak = max(peak, rssOf(t, pid))
	}
	elapsed := time.Since(at0)
	cpu, own := cpuTime(t, pid)-cpu0, proccpu.Self()-own0
	rss := rssOf(t, pid)
	lost := 0
	for _, s := range subs {
		select {
		case <-s.Done():
			lost++
		default:
		}
	}
	perSub := float64(rss-base) / float64(n)
	fmt.Printf("idle subscribers: %d connected in %v; listener RSS %.0f MiB -> %.0f MiB (peak %.0f MiB in the window): %.1f KiB per idle subscriber; "+
		"listener CPU %.1f%% of a core over %v (%.1f µs per subscriber per second); subscribers' side %.1f%% of a core; lost %d\n",
		n, setup.Round(time.Millisecond), float64(base)/(1<<20), float64(rss)/(1<<20), float64(peak)/(1<<20), perSub/1024,
		100*cpu.Seconds()/elapsed.Seconds(), elapsed.Round(time.Second), cpu.Seconds()/elapsed.Seconds()/float64(n)*1e6,
		100*own.Seconds()/elapsed.Seconds(), lost)
	if lost > 0 {
		t.Errorf("%d of %d idle subscribers lost their connection", lost, n)
	}
	// The child writes its heap profile, if asked, while every subscriber
	// is still connected.
	stdin.Close()
	_ = cmd.Wait()
}

// idleListenerChild is the listener side of TestIdleSubscribers: it prints
// its URL and serves until its stdin closes.
func idleListenerChild(t *testing.T) {
	n := envInt(t, "WEIDA_IDLE_SUBSCRIBERS", 10000)
	l, err := weida.Listen(context.Background(), "127.0.0.1:0", weida.ListenConfig{
		Limits: weida.Limits{MaxConnections: n + 16, MaxConnectionsPerPeer: n + 16, MaxConnectionsPerAddress: n + 16},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.Publisher("/idle"); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("URL weida://%s@%s/idle\n", l.Fingerprint(), l.Addr())
	_, _ = bufio.NewReader(os.Stdin).ReadByte() // EOF when the parent is done
	if f := os.Getenv("WEIDA_IDLE_HEAP_PROFILE"); f != "" {
		// Where an idle subscriber's memory goes (the parent closes stdin
		// before it closes the subscribers).
		out, err := os.Create(f)
		if err != nil {
			t.Fatal(err)
		}
		defer out.Close()
		runtime.GC()
		if err := pprof.WriteHeapProfile(out); err != nil {
			t.Fatal(err)
		}
	}
}
