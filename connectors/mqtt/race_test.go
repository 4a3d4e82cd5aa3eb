package mqtt

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// TestSourceFiltersRace: the goroutine that subscribes on every new
// connection reads the Source's filters, which Start writes under the
// Source's lock. Before, it read them without the lock, and a second
// Start raced with it (go test -race). Now the goroutine subscribes the
// filters its own Start was given, and a Source refuses a second Start: it
// serves one attempt.
func TestSourceFiltersRace(t *testing.T) {
	requireBroker(t)
	id := fmt.Sprintf("filters-race-%08x", rand.Uint32())
	src, err := NewSource(harness{t: t}.config(id, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := src.Start(ctx, []string{id + "/a"}); err != nil {
		t.Fatal(err)
	}
	// Time for the subscribing goroutine to run; no synchronisation on
	// purpose, which would hide the race from the detector.
	time.Sleep(500 * time.Millisecond)
	if err := src.Start(ctx, []string{id + "/b"}); err == nil {
		t.Error("a second Start succeeded; a Source serves one attempt")
	}
}
