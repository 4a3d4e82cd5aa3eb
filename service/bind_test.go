package service

import (
	"net"
	"testing"
)

// TestLoopbackOnly decides the admin listener's bind warning: only a
// loopback address keeps it to this host.
func TestLoopbackOnly(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:9090": true,
		"[::1]:9090":     true,
		"0.0.0.0:9090":   false,
		"[::]:9090":      false,
		"10.1.2.3:9090":  false,
	} {
		a, err := net.ResolveTCPAddr("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := loopbackOnly(a); got != want {
			t.Errorf("loopbackOnly(%s) = %t, want %t", addr, got, want)
		}
	}
}
