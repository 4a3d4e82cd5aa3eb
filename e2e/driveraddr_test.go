package e2e

import (
	"net"
	"strconv"
	"testing"
)

// splitAddr returns the host and port of addr ("host:port"). The drivers'
// Configs take a broker's address already parsed, as package resources
// hands it to them, not a URL.
func splitAddr(t testing.TB, addr string) (host string, port int) {
	t.Helper()
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	port, err = strconv.Atoi(p)
	if err != nil {
		t.Fatalf("port of %s: %v", addr, err)
	}
	return host, port
}
