package connectors_test

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
func TestNetworkReason(t *testing.T) {
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
		{"refused", refused, connectors.FailBrokerUnreachable},
		{"dns", noName, connectors.FailDNS},
		{"tls", untrusted, connectors.FailTLS},
		{"wrapped", fmt.Errorf("connecting: %w", refused), connectors.FailBrokerUnreachable},
		{"other", errors.New("something else"), ""},
		{"nil", nil, ""},
	} {
		if got := connectors.NetworkReason(c.err); got != c.want {
			t.Errorf("%s: connectors.NetworkReason(%v) = %q, want %q", c.name, c.err, got, c.want)
		}
	}
	var f *connectors.Failure
	if err := connectors.ClassifyNetwork(refused); !errors.As(err, &f) || f.Reason != connectors.FailBrokerUnreachable || f.Permanent {
		t.Errorf("connectors.ClassifyNetwork(refused) = %#v", err)
	}
	already := connectors.Retryable("CredentialsRefused", refused)
	if err := connectors.ClassifyNetwork(already); err != already {
		t.Errorf("Classify changed a Failure: %v", err)
	}
}
