package mqtt

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"weida.dev/connector/connectors"
)

// TestCredentialsReadBeforeEachConnection: a Source asks Config.Credentials
// before every connection autopaho makes, so a reconnection within the
// attempt uses the secret as it is now; one that cannot be read fails that
// connection with SecretUnavailable, and autopaho keeps trying.
func TestCredentialsReadBeforeEachConnection(t *testing.T) {
	requireBroker(t)
	id := fmt.Sprintf("creds-%08x", rand.Uint32())
	var mu sync.Mutex
	calls, connects := 0, 0
	var unreadable error
	var reasons []string
	cfg := harness{t: t}.config(id, "")
	cfg.Credentials = func() (string, []byte, error) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if unreadable != nil {
			return "", nil, unreadable
		}
		return "bridge", []byte(fmt.Sprintf("pw-%d", calls)), nil
	}
	report := func(s connectors.ConnState) {
		mu.Lock()
		defer mu.Unlock()
		reasons = append(reasons, s.Reason)
		if s.Reason == "Connected" {
			connects++
		}
	}
	src, err := NewSource(cfg, report)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := src.Start(ctx, []string{id + "/#"}); err != nil {
		t.Fatal(err)
	}
	wait := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			mu.Lock()
			ok := cond()
			mu.Unlock()
			if ok {
				return
			}
			if time.Now().After(deadline) {
				mu.Lock()
				defer mu.Unlock()
				t.Fatalf("timed out waiting for %s: %d calls, reports %v", what, calls, reasons)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	wait("the first connection", func() bool { return connects == 1 && calls == 1 })

	src.cutConnection()
	wait("a reconnection that read the credentials again", func() bool { return connects == 2 && calls == 2 })

	mu.Lock()
	unreadable = errors.New("resources: secret unavailable: file /run/secrets/pw: no such file or directory")
	mu.Unlock()
	src.cutConnection()
	wait("a SecretUnavailable report", func() bool {
		for _, r := range reasons {
			if r == connectors.FailSecretUnavailable {
				return true
			}
		}
		return false
	})
	mu.Lock()
	unreadable = nil
	mu.Unlock()
	wait("a reconnection once the secret is readable again", func() bool { return connects == 3 })
}
