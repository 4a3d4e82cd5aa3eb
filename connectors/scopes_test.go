package connectors_test

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"weida.dev/connector/connectors"
	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/weida"
)

// clientCert writes a self-signed client certificate and key under dir
// and returns their paths and the certificate's fingerprint.
func clientCert(t *testing.T, dir string) (certFile, keyFile, fp string) {
	t.Helper()
	c := brokertest.WriteCert(t, dir, "client", &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "scoped client"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, nil)
	return c.CertFile, c.KeyFile, weida.Fingerprint(c.Cert)
}

// gauge reads the value of the series of name whose labels include want.
func seriesValue(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue series
				}
			}
			return m.GetCounter().GetValue() + m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// TestScopesReloadLive: a reload that narrows a client's scopes drops its
// subscriptions outside them on the live connection, which stays up with
// the rest; the refusal and the revocation are in the resource's series.
func TestScopesReloadLive(t *testing.T) {
	certFile, keyFile, fp := clientCert(t, t.TempDir())
	reg := prometheus.NewRegistry()
	m := connectors.NewMetrics(reg)
	rt := connectors.NewRuntime(connectors.Deps{Metrics: m})
	t.Cleanup(rt.Stop)
	if err := reg.Register(rt.Collector()); err != nil {
		t.Fatal(err)
	}
	unit := func(rev string, scopes ...string) connectors.Unit {
		u := inboundUnit(t, "scoped", "127.0.0.1:0", &sources{})
		u.Revision = rev
		u.ListenConfig.ClientFingerprints = []string{fp}
		u.Scopes = weida.Scopes{fp: scopes}
		return u
	}
	ctx := context.Background()
	if err := rt.Apply(ctx, []connectors.Unit{unit("rev1", "in.#")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the endpoint", func() bool { return statusOf(rt, "scoped").SubscriberURL != "" })
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	sub, err := weida.Dial(dctx, statusOf(rt, "scoped").SubscriberURL, weida.DialConfig{CertFile: certFile, KeyFile: keyFile})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	for _, f := range []string{"in.a", "in.b", "#"} {
		// "#" is refused; the subscriber may see it (see
		// weida.ErrSubscriptionRefused) or not.
		if err := sub.Subscribe(dctx, f); err != nil && !errors.Is(err, weida.ErrSubscriptionRefused) {
			t.Fatal(err)
		}
	}
	subs := func() float64 {
		v, _ := seriesValue(t, reg, "weida_connector_weida_subscriptions", nil)
		return v
	}
	refusals := func(reason string) float64 {
		v, _ := seriesValue(t, reg, "weida_connector_weida_scope_refusals_total", map[string]string{"resource": "scoped", "reason": reason})
		return v
	}
	waitFor(t, "two subscriptions and # refused", func() bool { return subs() == 2 && refusals("not-covered") == 1 })
	if _, ok := seriesValue(t, reg, "weida_connector_weida_scope_refusals_total", map[string]string{"resource": "scoped", "reason": "revoked"}); !ok {
		t.Error("the revoked series does not exist at zero")
	}

	if err := rt.Apply(ctx, []connectors.Unit{unit("rev2", "in.a")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "in.b revoked", func() bool { return subs() == 1 && refusals("revoked") == 1 })
	if v, _ := seriesValue(t, reg, "weida_connector_weida_connections", nil); v != 1 {
		t.Errorf("%v connections after the reload, want the same one", v)
	}
	if err := sub.Subscribe(dctx, "in.*"); err != nil && !errors.Is(err, weida.ErrSubscriptionRefused) {
		t.Fatal(err)
	}
	waitFor(t, "in.* refused under the new scopes", func() bool { return refusals("not-covered") == 2 })
	if subs() != 1 {
		t.Errorf("%v subscriptions, want in.a alone", subs())
	}
}
