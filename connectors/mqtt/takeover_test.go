package mqtt

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"weida.dev/connector/connectors"
)

// TestSessionTakeoverSlowsDown: two Sources with one client ID take the
// session from each other (Mosquitto 2.0 closes the older connection
// without saying why). Each notices that its connections keep dropping
// soon after they come up, says what may cause it (naming the client ID and
// what to do) and waits longer before every new attempt, instead of
// reconnecting at once for ever.
func TestSessionTakeoverSlowsDown(t *testing.T) {
	requireBroker(t)
	id := fmt.Sprintf("takeover-%08x", rand.Uint32())
	var mu sync.Mutex
	connects, takeovers := 0, 0
	var detail string
	report := func(s connectors.ConnState) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case s.Reason == "Connected":
			connects++
		case strings.Contains(s.Detail, "give each its own clientID"):
			takeovers++
			detail = s.Detail
		}
	}
	for range 2 {
		src, err := NewSource(harness{t: t}.config(id, ""), report)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := src.Start(ctx, []string{id + "/#"}); err != nil {
			t.Fatal(err)
		}
		cancel()
		defer src.Close(context.Background())
	}
	time.Sleep(3 * time.Second)
	mu.Lock()
	defer mu.Unlock()
	if takeovers == 0 || !strings.Contains(detail, id) || !strings.Contains(detail, "${HOSTNAME}") {
		t.Fatalf("%d takeovers reported, last detail %q; want the client ID and what to do", takeovers, detail)
	}
	// With the test's backoff (50 ms doubling to 1 s), about a dozen
	// connections fit in 3 s; reconnecting at once made hundreds.
	if connects > 25 {
		t.Errorf("%d connections in 3 s: the takeovers did not slow the reconnections", connects)
	}
	t.Logf("%d connections and %d takeovers in 3 s", connects, takeovers)
}
