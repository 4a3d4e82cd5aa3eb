package service_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"weida.dev/connector/service"
)

// TestAdminBindWarning: Run warns at start when the admin listener binds
// beyond loopback, and says nothing of it on loopback. Nothing is sent to
// the wildcard listener; it only binds.
func TestAdminBindWarning(t *testing.T) {
	file := outboundFile(t, "bind")
	for addr, warn := range map[string]bool{"127.0.0.1:0": false, "0.0.0.0:0": true} {
		var logs lockedBuffer
		e := env(nil)
		e.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
		ctx, cancel := context.WithCancel(context.Background())
		reload := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- service.Run(ctx, service.Config{Env: e, Paths: []string{file}, Admin: addr, Drain: time.Second}, reload)
		}()
		select {
		case reload <- struct{}{}: // taken once the resources run, after the listener is up
		case err := <-done:
			t.Fatalf("Run(%s) returned %v", addr, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("Run(%s) did not start", addr)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run(%s) = %v", addr, err)
		}
		if got := strings.Contains(logs.String(), "reachable beyond this host"); got != warn {
			t.Errorf("--admin %s: warned %t, want %t; logs:\n%s", addr, got, warn, logs.String())
		}
	}
}
