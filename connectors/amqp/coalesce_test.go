package amqp

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"

	"pgregory.net/rapid"
)

// TestCoalescingConnBytes: whatever the sizes of the writes, the peer reads
// exactly their concatenation, in order.
func TestCoalescingConnBytes(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		writes := rapid.SliceOfN(rapid.SliceOfN(rapid.Byte(), 0, 3000), 0, 50).Draw(t, "writes")
		a, b := net.Pipe()
		c := newCoalescingConn(a)
		var want bytes.Buffer
		got := make(chan []byte, 1)
		go func() { all, _ := io.ReadAll(b); got <- all }()
		for _, w := range writes {
			want.Write(w)
			if n, err := c.Write(w); n != len(w) || err != nil {
				t.Fatalf("Write = %d, %v", n, err)
			}
		}
		// Wait until everything is out, then close: Close drops what is
		// still gathered.
		for !c.drained() {
		}
		c.Close()
		if g := <-got; !bytes.Equal(g, want.Bytes()) {
			t.Fatalf("peer read %d bytes, want %d", len(g), want.Len())
		}
	})
}

// drained reports whether nothing is gathered or being written (tests only).
func (c *coalescingConn) drained() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.buf) == 0 && len(c.wake) == 0 && !c.writing
}

// TestCoalescingConnConcurrentRecords: concurrent writers' records arrive
// whole, never interleaved.
func TestCoalescingConnConcurrentRecords(t *testing.T) {
	a, b := net.Pipe()
	c := newCoalescingConn(a)
	const writers, records = 8, 200
	got := make(chan []byte, 1)
	go func() { all, _ := io.ReadAll(b); got <- all }()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range records {
				if _, err := fmt.Fprintf(c, "<%d:%04d:%s>", w, r, bytes.Repeat([]byte{'a' + byte(w)}, 100)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for !c.drained() {
	}
	c.Close()
	all := <-got
	seen := map[string]bool{}
	for len(all) > 0 {
		end := bytes.IndexByte(all, '>')
		if all[0] != '<' || end < 0 {
			t.Fatalf("interleaved record at %q", all[:min(len(all), 40)])
		}
		rec := string(all[:end+1])
		var w, r int
		var body string
		if _, err := fmt.Sscanf(rec, "<%d:%d:%s", &w, &r, &body); err != nil || body != string(bytes.Repeat([]byte{'a' + byte(w)}, 100))+">" {
			t.Fatalf("garbled record %q", rec)
		}
		seen[rec] = true
		all = all[end+1:]
	}
	if len(seen) != writers*records {
		t.Fatalf("%d records, want %d", len(seen), writers*records)
	}
}

// TestCoalescingConnError: after the network fails, every Write fails, and
// Close still returns.
func TestCoalescingConnError(t *testing.T) {
	a, b := net.Pipe()
	c := newCoalescingConn(a)
	b.Close()
	var err error
	for err == nil {
		_, err = c.Write([]byte("x"))
	}
	if !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("Write after failure = %v, want the pipe's error", err)
	}
	if _, err := c.Write([]byte("y")); err == nil {
		t.Fatal("a second Write succeeded after the failure")
	}
	c.Close()
	c.Close()
	if _, err := c.Write([]byte("z")); err == nil {
		t.Fatal("Write after Close succeeded")
	}
}

// TestCoalescingConnBackpressure: a writer waits once maxPendingWrite bytes
// are gathered and the network does not take them, and Close releases it.
func TestCoalescingConnBackpressure(t *testing.T) {
	a, b := net.Pipe() // nobody reads b: the flusher's first write blocks
	defer b.Close()
	c := newCoalescingConn(a)
	big := make([]byte, maxPendingWrite/2)
	done := make(chan error, 1)
	go func() {
		for {
			if _, err := c.Write(big); err != nil {
				done <- err
				return
			}
		}
	}()
	for {
		c.mu.Lock()
		full := len(c.buf) >= maxPendingWrite/2 && c.writing
		c.mu.Unlock()
		if full {
			break
		}
	}
	c.Close()
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("blocked Write = %v, want net.ErrClosed", err)
	}
}
