package weida

import (
	"context"
	"testing"
)

// TestPublishAllocs: Publish itself allocates nothing per call once its
// frame pool is warm, whether nobody matches or the copy is dropped. (A
// queued copy lives on in the writer, so the allocations of that path are
// those weida/bench's BenchmarkPublishReceive reports for the whole
// pipeline.)
func TestPublishAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	l := listen(t, ListenConfig{Limits: Limits{SubscriberBufferBytes: 1000}})
	p := publisher(t, l, "/md")
	// A subscriber that never reads and grants a single stream: its
	// writer blocks, its queue fills, and later copies are dropped.
	s := dial(t, l, "/md", DialConfig{Limits: Limits{MaxConcurrentUniStreams: 1}})
	subscribe(t, l, s, 1, "a.#")
	ctx := context.Background()
	for _, topic := range []string{"b.c", "a.b"} {
		msg := Message{Topic: topic, Payload: make([]byte, 256)}
		for range 20 { // fill the queue, warm the pool
			_, _ = p.Publish(ctx, msg)
		}
		allocs := testing.AllocsPerRun(1000, func() { _, _ = p.Publish(ctx, msg) })
		if allocs != 0 {
			t.Errorf("Publish(%q): %v allocations, want 0", topic, allocs)
		}
	}
	if l.Stats().Dropped.BufferFull == 0 {
		t.Error("the drop path was not exercised")
	}
}
