package weida

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"weida.dev/connector/weida/wire"
)

// issueClient issues a client certificate signed by ca, with the
// subject CommonName cn, valid for the hour around now; edit changes the
// template before signing (names, dates, key usages).
func issueClient(t *testing.T, ca *testCert, cn string, edit func(*x509.Certificate)) *testCert {
	t.Helper()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if edit != nil {
		edit(tmpl)
	}
	return writeCert(t, "c", tmpl, ca)
}

func withURI(t *testing.T, raw string) func(*x509.Certificate) {
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return func(c *x509.Certificate) { c.URIs = append(c.URIs, u) }
}

const (
	idDash  = "uri:spiffe://plant-a/dash"
	idDNS   = "dns:dash-7.plant-a.example"
	idPlain = "cn:ops-console"
)

// caListener listens with a client CA, the identities idDash, idDNS and
// idPlain, and one pinned fingerprint (pinned); /p replays plant.a.x,
// plant.b.y and plant.c.z, and its scopes give idDash plant.a.#, idDNS
// plant.b.#, pinned plant.c.#, idPlain everything.
func caListener(t *testing.T, logs *logBuffer, caFile string, pinned *testCert) (*Listener, *storeReplayer) {
	t.Helper()
	l := listen(t, ListenConfig{
		ClientFingerprints: []string{Fingerprint(pinned.cert)},
		ClientIdentities:   []string{idDash, idDNS, idPlain},
		ClientCAFile:       caFile,
		Logger:             logs.logger(),
	})
	p := publisher(t, l, "/p")
	r := &storeReplayer{}
	p.SetReplayer(r)
	for _, tp := range []string{"plant.a.x", "plant.b.y", "plant.c.z"} {
		r.publish(t, p, tp, tp)
	}
	if err := l.SetScopes("/p", Scopes{
		idDash:                   {"plant.a.#"},
		idDNS:                    {"plant.b.#"},
		idPlain:                  {"#"},
		Fingerprint(pinned.cert): {"plant.c.#"},
	}); err != nil {
		t.Fatal(err)
	}
	return l, r
}

// expectScopes dials l as c and checks, filter by filter, that a
// SUBSCRIBE in admitted is served (its replay arrives) and one in refused
// is stopped with REJECTED.
func expectScopes(t *testing.T, l *Listener, c *testCert, admitted map[string]string, refused ...string) {
	t.Helper()
	rc := rawDialAs(t, l, c)
	rc.hello()
	for _, f := range refused {
		st := rc.sendOpen(subscribeFrame(wire.KindSubscribe, "/p", f))
		if code := stopCode(t, st); code != quic.StreamErrorCode(Rejected) {
			t.Fatalf("%s: SUBSCRIBE %q stopped with %d, want REJECTED", c.cert.Subject.CommonName, f, code)
		}
	}
	for f, topic := range admitted {
		rc.send(subscribeFrame(wire.KindSubscribe, "/p", f))
		if d, _ := rc.nextData(); d.Topic != topic {
			t.Fatalf("%s: SUBSCRIBE %q replayed %q, want %q", c.cert.Subject.CommonName, f, d.Topic, topic)
		}
	}
	_ = rc.qc.CloseWithError(0, "")
}

// TestClientCAAdmitsByIdentity: a client whose certificate the client CA
// issued is admitted under each listed identity it carries, with the
// union of their scopes; a pinned fingerprint works beside them; a
// certificate of the CA with no listed identity, one of another CA with
// a listed identity, an expired one and one not for client
// authentication are refused as an unlisted fingerprint is, each with its
// reason logged and counted.
func TestClientCAAdmitsByIdentity(t *testing.T) {
	ca, otherCA := newCert(t, "ca", nil), newCert(t, "other-ca", nil)
	pinned := newCert(t, "pinned", nil) // self-signed: admitted by its key alone
	var logs logBuffer
	l, _ := caListener(t, &logs, ca.certFile, pinned)

	dash := issueClient(t, ca, "dash", withURI(t, "spiffe://plant-a/dash"))
	both := issueClient(t, ca, "both", func(c *x509.Certificate) {
		withURI(t, "spiffe://plant-a/dash")(c)
		c.DNSNames = []string{"dash-7.plant-a.example"}
	})
	byCN := issueClient(t, ca, "ops-console", nil)
	expectScopes(t, l, dash, map[string]string{"plant.a.#": "plant.a.x"}, "plant.b.#", "#")
	expectScopes(t, l, both, map[string]string{"plant.a.#": "plant.a.x", "plant.b.#": "plant.b.y"}, "plant.c.#", "plant.#")
	expectScopes(t, l, byCN, map[string]string{"plant.c.#": "plant.c.z"}) // "#" is admitted too; one topic keeps the replay order moot
	expectScopes(t, l, pinned, map[string]string{"plant.c.#": "plant.c.z"}, "plant.a.#")
	// A client known under several names is counted under the first
	// its scopes list (names sort, so "both" counts under idDNS).
	if sc := l.Stats().Scopes["/p"]; sc.Clients[idDash] != 2 || sc.Clients[idDNS] != 2 || sc.Clients[Fingerprint(pinned.cert)] != 1 {
		t.Errorf("Scopes[/p].Clients = %v: want 2 under %s, 2 under %s, 1 under the pinned fingerprint", sc.Clients, idDash, idDNS)
	}
	if st := l.Stats(); st.ClientsRefused != 0 {
		t.Fatalf("ClientsRefused = %d before any refused client", st.ClientsRefused)
	}

	for i, c := range []struct {
		name   string
		cert   *testCert
		reason string
	}{
		{"another name", issueClient(t, ca, "dash-8", func(c *x509.Certificate) { c.DNSNames = []string{"dash-8.plant-a.example"} }),
			`reason="no listed fingerprint or identity"`},
		{"another CA", issueClient(t, otherCA, "dash", withURI(t, "spiffe://plant-a/dash")),
			`reason="certificate not verified by the client CA: x509: certificate signed by unknown authority`},
		{"expired", issueClient(t, ca, "dash", func(c *x509.Certificate) {
			withURI(t, "spiffe://plant-a/dash")(c)
			c.NotBefore, c.NotAfter = time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour)
		}), `reason="certificate not verified by the client CA: x509: certificate has expired or is not yet valid`},
		{"server only", issueClient(t, ca, "dash", func(c *x509.Certificate) {
			withURI(t, "spiffe://plant-a/dash")(c)
			c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		}), `reason="certificate not verified by the client CA: x509: certificate specifies an incompatible key usage"`},
		{"case differs", issueClient(t, ca, "OPS-CONSOLE", nil), `reason="no listed fingerprint or identity"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Dial(testCtx(t), pinnedURL(l, "/p"), DialConfig{CertFile: c.cert.certFile, KeyFile: c.cert.keyFile})
			if !errors.Is(err, ErrClientRefused) {
				t.Fatalf("Dial = %v, want ErrClientRefused", err)
			}
			want := `msg="weida: refused client" ` + c.reason
			waitFor(t, "the refusal in the log", func() bool { return strings.Contains(logs.String(), want) })
			if got := l.Stats().ClientsRefused; got != uint64(i+1) {
				t.Errorf("ClientsRefused = %d, want %d", got, i+1)
			}
		})
	}
}

// TestClientCAReload: the client CA file is read again when it changes,
// without a restart: after it is replaced by another CA, clients of the
// new CA are admitted and those of the old one refused; a file that
// cannot be loaded is logged and the last good CA kept.
func TestClientCAReload(t *testing.T) {
	one, two := newCert(t, "one", nil), newCert(t, "two", nil)
	caFile := filepath.Join(t.TempDir(), "client-ca.pem")
	copyOver(t, one.certFile, caFile)
	pinned := newCert(t, "pinned", nil)
	var logs logBuffer
	l, _ := caListener(t, &logs, caFile, pinned)
	ofOne := issueClient(t, one, "dash", withURI(t, "spiffe://plant-a/dash"))
	ofTwo := issueClient(t, two, "dash", withURI(t, "spiffe://plant-a/dash"))
	dialAs := func(c *testCert) error {
		s, err := Dial(testCtx(t), pinnedURL(l, "/p"), DialConfig{CertFile: c.certFile, KeyFile: c.keyFile})
		if err == nil {
			_ = s.Close()
		}
		return err
	}
	if err := dialAs(ofOne); err != nil {
		t.Fatalf("client of the first CA: %v", err)
	}
	if err := dialAs(ofTwo); !errors.Is(err, ErrClientRefused) {
		t.Fatalf("client of the second CA before the rotation: %v, want ErrClientRefused", err)
	}

	copyOver(t, two.certFile, caFile)
	pollFor(t, "the second CA's client to be admitted", func() bool { return dialAs(ofTwo) == nil })
	if err := dialAs(ofOne); !errors.Is(err, ErrClientRefused) {
		t.Fatalf("client of the first CA after the rotation: %v, want ErrClientRefused", err)
	}
	waitFor(t, "the reload in the log", func() bool {
		return strings.Contains(logs.String(), "reloaded the client CA file")
	})

	// A damaged file, and then one holding a leaf instead of a CA: both
	// logged, the second CA kept.
	bad := filepath.Join(t.TempDir(), "bad.pem")
	for _, content := range [][]byte{
		[]byte("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ofOne.cert.Raw}),
	} {
		before := strings.Count(logs.String(), "client CA file changed and cannot be loaded")
		if err := os.WriteFile(bad, content, 0o600); err != nil {
			t.Fatal(err)
		}
		copyOver(t, bad, caFile)
		pollFor(t, "the failed reload in the log", func() bool {
			_ = dialAs(ofTwo) // a handshake makes the listener look
			return strings.Count(logs.String(), "client CA file changed and cannot be loaded") > before
		})
		if err := dialAs(ofTwo); err != nil {
			t.Fatalf("client of the kept CA after a bad file: %v", err)
		}
	}
}

// TestClientCAConfigErrors: Listen refuses identities without a CA, a CA
// without identities, an identity it cannot match, and a CA file that
// holds no CA certificate.
func TestClientCAConfigErrors(t *testing.T) {
	ca := newCert(t, "ca", nil)
	leaf := issueClient(t, ca, "leaf", nil)
	for _, c := range []struct {
		name string
		cfg  ListenConfig
		want string
	}{
		{"identities without CA", ListenConfig{ClientIdentities: []string{idDash}}, "needs ClientCAFile"},
		{"CA without identities", ListenConfig{ClientCAFile: ca.certFile}, "needs ClientIdentities"},
		{"unknown kind", ListenConfig{ClientIdentities: []string{"ip:10.0.0.1"}, ClientCAFile: ca.certFile}, `must start with "dns:"`},
		{"empty value", ListenConfig{ClientIdentities: []string{"dns:"}, ClientCAFile: ca.certFile}, "names no dns value"},
		{"leaf as CA", ListenConfig{ClientIdentities: []string{idDash}, ClientCAFile: leaf.certFile}, "is not a CA certificate"},
		{"key as CA", ListenConfig{ClientIdentities: []string{idDash}, ClientCAFile: ca.keyFile}, "holds no PEM certificate"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Listen(testCtx(t), "127.0.0.1:0", c.cfg)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Listen = %v, want an error saying %q", err, c.want)
			}
		})
	}
}

// TestCertIdentities pins the text forms the matching compares.
func TestCertIdentities(t *testing.T) {
	u, _ := url.Parse("spiffe://plant-a/dash")
	c := &x509.Certificate{
		Subject:        pkix.Name{CommonName: "dash-7", Organization: []string{"plant-a"}},
		DNSNames:       []string{"dash-7.plant-a.example"},
		URIs:           []*url.URL{u},
		EmailAddresses: []string{"ops@plant-a.example"},
	}
	got := strings.Join(certIdentities(c), " ")
	want := "dns:dash-7.plant-a.example uri:spiffe://plant-a/dash email:ops@plant-a.example cn:dash-7"
	if got != want {
		t.Errorf("certIdentities = %q, want %q", got, want)
	}
}

// TestClientCAFingerprintAndIdentity: a CA-issued certificate whose
// fingerprint is also pinned gets the union of the fingerprint's scopes
// and its identity's; another client pinned beside it keeps its own.
func TestClientCAFingerprintAndIdentity(t *testing.T) {
	ca := newCert(t, "ca", nil)
	dash := issueClient(t, ca, "dash", withURI(t, "spiffe://plant-a/dash"))
	other := issueClient(t, ca, "other", nil)
	l := listen(t, ListenConfig{
		ClientFingerprints: []string{Fingerprint(dash.cert), Fingerprint(other.cert)},
		ClientIdentities:   []string{idDash},
		ClientCAFile:       ca.certFile,
	})
	p := publisher(t, l, "/p")
	r := &storeReplayer{}
	p.SetReplayer(r)
	for _, tp := range []string{"plant.a.x", "plant.c.z"} {
		r.publish(t, p, tp, tp)
	}
	if err := l.SetScopes("/p", Scopes{Fingerprint(dash.cert): {"plant.c.#"}, idDash: {"plant.a.#"}, Fingerprint(other.cert): {"plant.c.#"}}); err != nil {
		t.Fatal(err)
	}
	expectScopes(t, l, dash, map[string]string{"plant.a.#": "plant.a.x", "plant.c.#": "plant.c.z"}, "plant.#")
	expectScopes(t, l, other, map[string]string{"plant.c.#": "plant.c.z"}, "plant.a.#")
}
