package weida

import (
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"weida.dev/connector/internal/brokertest"
)

// testCert is a certificate and key written as PEM files.
type testCert struct {
	cert     *x509.Certificate
	key      *ecdsa.PrivateKey
	certFile string
	keyFile  string
}

// newCert issues a certificate for the given names (IPs or DNS names),
// signed by parent, or self-signed (and a CA) when parent is nil.
func newCert(t *testing.T, name string, parent *testCert, hosts ...string) *testCert {
	t.Helper()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	if parent == nil {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
	}
	return writeCert(t, name, tmpl, parent)
}

// writeCert signs tmpl with parent's key (or its own when parent is nil)
// through brokertest.WriteCert, into a directory of its own.
func writeCert(t *testing.T, name string, tmpl *x509.Certificate, parent *testCert) *testCert {
	t.Helper()
	var signer *brokertest.Cert
	if parent != nil {
		signer = &brokertest.Cert{Cert: parent.cert, Key: parent.key}
	}
	c := brokertest.WriteCert(t, t.TempDir(), name, tmpl, signer)
	return &testCert{cert: c.Cert, key: c.Key, certFile: c.CertFile, keyFile: c.KeyFile}
}

func TestFingerprintFormat(t *testing.T) {
	l := listen(t, ListenConfig{})
	fp := l.Fingerprint()
	if !strings.HasPrefix(fp, "sha256:") || len(fp) != len("sha256:")+64 || strings.ToLower(fp) != fp {
		t.Fatalf("Fingerprint = %q", fp)
	}
	c := newCert(t, "srv", nil, "127.0.0.1")
	l2 := listen(t, ListenConfig{CertFile: c.certFile, KeyFile: c.keyFile})
	if got, want := l2.Fingerprint(), Fingerprint(c.cert); got != want {
		t.Fatalf("Fingerprint = %s, want %s", got, want)
	}
}

func TestSelfSignedFingerprintLogged(t *testing.T) {
	var logs logBuffer
	l := listen(t, ListenConfig{Logger: logs.logger()})
	if !strings.Contains(logs.String(), l.Fingerprint()) {
		t.Fatalf("the generated fingerprint is not in the log:\n%s", logs.String())
	}
}

func TestPinning(t *testing.T) {
	l := listen(t, ListenConfig{})
	other := listen(t, ListenConfig{})
	// Right pin: accepted even though the self-signed name is not the IP.
	dial(t, l, "/p", DialConfig{})
	// Wrong pin: refused in the handshake.
	wrong := "weida://" + other.Fingerprint() + "@" + l.Addr().String() + "/p"
	if _, err := Dial(testCtx(t), wrong, DialConfig{}); !errors.Is(err, ErrFingerprintMismatch) || !strings.Contains(err.Error(), "the URL pins "+other.Fingerprint()) {
		t.Fatalf("Dial with a wrong pin: %v", err)
	}
	// A pin overrides a CA file that would not verify the server.
	ca := newCert(t, "ca", nil)
	s, err := Dial(testCtx(t), pinnedURL(l, "/p"), DialConfig{CAFile: ca.certFile})
	if err != nil {
		t.Fatalf("pinned Dial with an unrelated CA: %v", err)
	}
	_ = s.Close()
}

func TestNoTrust(t *testing.T) {
	l := listen(t, ListenConfig{})
	_, err := Dial(testCtx(t), "weida://"+l.Addr().String()+"/p", DialConfig{})
	if !errors.Is(err, ErrNoTrust) || !strings.Contains(err.Error(), "sha256:") {
		t.Fatalf("Dial without trust: %v, want ErrNoTrust saying how to pin", err)
	}
	s, err := Dial(testCtx(t), "weida://"+l.Addr().String()+"/p", DialConfig{InsecureSkipVerifyForTesting: true})
	if err != nil {
		t.Fatalf("Dial with the test option: %v", err)
	}
	_ = s.Close()
}

func TestCAFile(t *testing.T) {
	ca := newCert(t, "ca", nil)
	srv := newCert(t, "srv", ca, "127.0.0.1", "localhost")
	l := listen(t, ListenConfig{CertFile: srv.certFile, KeyFile: srv.keyFile})
	port := l.Addr().(*net.UDPAddr).Port
	url := func(host string) string { return "weida://" + net.JoinHostPort(host, strconv.Itoa(port)) + "/p" }
	s, err := Dial(testCtx(t), url("127.0.0.1"), DialConfig{CAFile: ca.certFile})
	if err != nil {
		t.Fatalf("Dial with the CA: %v", err)
	}
	_ = s.Close()
	// The chain must also name the dialled host.
	ipOnly := newCert(t, "iponly", ca, "127.0.0.2")
	l2 := listen(t, ListenConfig{CertFile: ipOnly.certFile, KeyFile: ipOnly.keyFile})
	port = l2.Addr().(*net.UDPAddr).Port
	if _, err := Dial(testCtx(t), url("127.0.0.1"), DialConfig{CAFile: ca.certFile}); err == nil {
		t.Fatal("Dial accepted a certificate that does not name the host")
	}
	// Another CA does not vouch for it.
	other := newCert(t, "other", nil)
	port = l.Addr().(*net.UDPAddr).Port
	if _, err := Dial(testCtx(t), url("127.0.0.1"), DialConfig{CAFile: other.certFile}); err == nil {
		t.Fatal("Dial accepted a certificate from an unknown CA")
	}
}

// TestClientAllowlist: with ClientFingerprints, a listed client is served;
// one with an unlisted certificate or none at all fails the TLS handshake,
// is logged with the reason and counted, and Dial says what to do.
func TestClientAllowlist(t *testing.T) {
	ca := newCert(t, "ca", nil)
	good := newCert(t, "good", ca)
	bad := newCert(t, "bad", ca)
	var logs logBuffer
	l := listen(t, ListenConfig{ClientFingerprints: []string{Fingerprint(good.cert)}, Logger: logs.logger()})
	p := publisher(t, l, "/p")
	s := dial(t, l, "/p", DialConfig{CertFile: good.certFile, KeyFile: good.keyFile})
	subscribe(t, l, s, 1, "")
	publish(t, p, "t", []byte("ok"))
	if m := receive(t, s); string(m.Payload) != "ok" {
		t.Fatalf("admitted client received %+v", m)
	}
	for i, c := range []struct {
		name    string
		cfg     DialConfig
		log     string // the listener's log line, from msg on
		errHint string // what Dial's error must tell
	}{
		{"unlisted certificate", DialConfig{CertFile: bad.certFile, KeyFile: bad.keyFile},
			`msg="weida: refused client" reason="fingerprint not listed" fingerprint=` + Fingerprint(bad.cert),
			Fingerprint(bad.cert)},
		{"no certificate", DialConfig{},
			`msg="weida: refused client" reason="no certificate" remote=127.0.0.1:`,
			"DialConfig.CertFile"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Dial(testCtx(t), pinnedURL(l, "/p"), c.cfg)
			var ce *CloseError
			if !errors.Is(err, ErrClientRefused) || !errors.As(err, &ce) || !ce.Remote || !strings.Contains(err.Error(), c.errHint) {
				t.Fatalf("Dial = %v; want ErrClientRefused and the peer's CloseError, naming %q", err, c.errHint)
			}
			waitFor(t, "the refusal in the log", func() bool { return strings.Contains(logs.String(), c.log) })
			if got := l.Stats().ClientsRefused; got != uint64(i+1) {
				t.Errorf("ClientsRefused = %d, want %d", got, i+1)
			}
		})
	}
	if st := l.Stats(); st.ConnectionsAccepted != 1 {
		t.Errorf("ConnectionsAccepted = %d: a refused client got past the handshake", st.ConnectionsAccepted)
	}
	// Invalid fingerprints are refused at Listen.
	if _, err := Listen(testCtx(t), "127.0.0.1:0", ListenConfig{ClientFingerprints: []string{"sha256:XYZ"}}); err == nil {
		t.Error("Listen accepted an invalid client fingerprint")
	}
}

// TestClientAllowlistHandshakeFailure: what a plain QUIC client without a
// certificate sees of the refusal is a failed TLS handshake (CRYPTO_ERROR
// with the bad_certificate alert), not a weida close: the listener never
// sends it a frame, HELLO included, and never accepts the connection.
func TestClientAllowlistHandshakeFailure(t *testing.T) {
	client := newCert(t, "client", nil)
	l := listen(t, ListenConfig{ClientFingerprints: []string{Fingerprint(client.cert)}})
	qc, err := quicDial(t, l, rawTLS())
	if err == nil {
		// A TLS 1.3 client finishes its side of the handshake before the
		// listener checks its certificate; the refusal follows.
		if st, aerr := qc.AcceptUniStream(testCtx(t)); aerr == nil {
			t.Fatalf("the refused client was sent stream %d", st.StreamID())
		}
		// AcceptUniStream can return a moment before the connection's
		// context records why it closed.
		select {
		case <-qc.Context().Done():
		case <-time.After(5 * time.Second):
		}
		err = context.Cause(qc.Context())
	}
	var te *quic.TransportError
	if !errors.As(err, &te) || !te.Remote || te.ErrorCode != quic.TransportErrorCode(0x100+42) {
		t.Fatalf("refused client saw %v, want the listener's CRYPTO_ERROR with alert bad_certificate (42)", err)
	}
	if st := l.Stats(); st.ClientsRefused != 1 || st.ConnectionsAccepted != 0 {
		t.Errorf("ClientsRefused = %d, ConnectionsAccepted = %d; want 1 and 0", st.ClientsRefused, st.ConnectionsAccepted)
	}
}

func TestMaxConnectionsPerPeer(t *testing.T) {
	client := newCert(t, "client", nil)
	l := listen(t, ListenConfig{Limits: Limits{MaxConnectionsPerPeer: 1}})
	cfg := DialConfig{CertFile: client.certFile, KeyFile: client.keyFile}
	dial(t, l, "/a", cfg)
	_, err := Dial(testCtx(t), pinnedURL(l, "/b"), cfg)
	var ce *CloseError
	if !errors.As(err, &ce) || ce.Code != LimitExceeded {
		t.Fatalf("second connection of one peer: %v, want LIMIT_EXCEEDED", err)
	}
	// Anonymous connections are each their own peer.
	dial(t, l, "/a", DialConfig{})
	dial(t, l, "/a", DialConfig{})
}

func TestALPNMismatchFailsHandshake(t *testing.T) {
	l := listen(t, ListenConfig{})
	conf := rawTLS()
	conf.NextProtos = []string{"h3"}
	if _, err := quicDial(t, l, conf); err == nil {
		t.Fatal("a client offering only h3 completed the handshake")
	}
}

func TestConfigErrors(t *testing.T) {
	c := newCert(t, "srv", nil)
	for _, cfg := range []ListenConfig{
		{CertFile: c.certFile},
		{KeyFile: c.keyFile},
		{CertFile: "/nonexistent", KeyFile: "/nonexistent"},
		{Limits: Limits{MaxSubscriptions: -1}},
	} {
		if _, err := Listen(testCtx(t), "127.0.0.1:0", cfg); err == nil {
			t.Errorf("Listen(%+v) succeeded", cfg)
		}
	}
	l := listen(t, ListenConfig{})
	for _, cfg := range []DialConfig{
		{CertFile: c.certFile},
		{CAFile: "/nonexistent"},
		{CAFile: c.keyFile}, // holds no certificate
	} {
		if _, err := Dial(testCtx(t), "weida://"+l.Addr().String()+"/p", cfg); err == nil {
			t.Errorf("Dial(%+v) succeeded", cfg)
		}
	}
	if _, err := Dial(testCtx(t), "http://x/y", DialConfig{}); err == nil {
		t.Error("Dial accepted a non-weida URL")
	}
}

// TestClientAllowlistKeyNotProven: a client that presents a listed
// certificate without holding its key fails the handshake inside crypto/tls,
// after the allowlist admitted it; the listener still counts and logs the
// refusal, so a copied certificate does not go unnoticed.
func TestClientAllowlistKeyNotProven(t *testing.T) {
	prev := certificateProofWait.Swap(int64(300 * time.Millisecond))
	defer certificateProofWait.Store(prev)
	listed := newCert(t, "listed", nil)
	other := newCert(t, "other", nil)
	var logs logBuffer
	l := listen(t, ListenConfig{ClientFingerprints: []string{Fingerprint(listed.cert)}, Logger: logs.logger()})
	tc := rawTLS()
	// The listed certificate, signed for with another key.
	tc.Certificates = []tls.Certificate{{Certificate: [][]byte{listed.cert.Raw}, PrivateKey: other.key}}
	if qc, err := quicDial(t, l, tc); err == nil {
		if _, aerr := qc.AcceptUniStream(testCtx(t)); aerr == nil {
			t.Fatal("a client without the certificate's key was served")
		}
	}
	want := `reason="key not proven (the handshake failed after the certificate was admitted)" fingerprint=` + Fingerprint(listed.cert)
	waitFor(t, "the refusal in the log", func() bool { return strings.Contains(logs.String(), want) })
	if st := l.Stats(); st.ClientsRefused != 1 || st.ConnectionsAccepted != 0 {
		t.Errorf("ClientsRefused = %d, ConnectionsAccepted = %d; want 1 and 0", st.ClientsRefused, st.ConnectionsAccepted)
	}
	// An admitted client is not counted once the wait has passed.
	dial(t, l, "/p", DialConfig{CertFile: listed.certFile, KeyFile: listed.keyFile})
	time.Sleep(500 * time.Millisecond)
	if got := l.Stats().ClientsRefused; got != 1 {
		t.Errorf("ClientsRefused = %d after an admitted client, want 1", got)
	}
}
