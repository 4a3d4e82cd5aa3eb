package netfail

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http/httptest"
	"testing"
	"time"

	"weida.dev/connector/connectors"
)

// TestReason dials for real: a closed loopback port, a name that cannot
// resolve, and a TLS server whose certificate the client does not trust.
func TestReason(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := l.Addr().String()
	l.Close()
	srv := httptest.NewTLSServer(nil)
	defer srv.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var d net.Dialer
	_, refused := d.DialContext(ctx, "tcp", closedAddr)
	_, noName := d.DialContext(ctx, "tcp", "no-such-host.invalid:1")
	td := tls.Dialer{NetDialer: &d, Config: &tls.Config{ServerName: "example.com"}}
	_, untrusted := td.DialContext(ctx, "tcp", srv.Listener.Addr().String())

	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"refused", refused, BrokerUnreachable},
		{"dns", noName, DNSFailure},
		{"tls", untrusted, TLSFailure},
		{"wrapped", fmt.Errorf("connecting: %w", refused), BrokerUnreachable},
		{"other", errors.New("something else"), ""},
		{"nil", nil, ""},
	} {
		if got := Reason(c.err); got != c.want {
			t.Errorf("%s: Reason(%v) = %q, want %q", c.name, c.err, got, c.want)
		}
	}
	var f *connectors.Failure
	if err := Classify(refused); !errors.As(err, &f) || f.Reason != BrokerUnreachable || f.Permanent {
		t.Errorf("Classify(refused) = %#v", err)
	}
	already := connectors.Retryable("CredentialsRefused", refused)
	if err := Classify(already); err != already {
		t.Errorf("Classify changed a Failure: %v", err)
	}
}
