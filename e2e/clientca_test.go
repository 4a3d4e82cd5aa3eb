package e2e

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net/url"
	"os/exec"
	"strings"
	"testing"
	"time"

	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/policy"
)

// testCA is a CA that issues client certificates for a test.
type testCA struct {
	*brokertest.Cert
	file string // the CA certificate, PEM
}

func newTestCA(t *testing.T, dir, name string) *testCA {
	t.Helper()
	c := brokertest.WriteCert(t, dir, name, &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		IsCA:                  true,
		BasicConstraintsValid: true,
	}, nil)
	return &testCA{Cert: c, file: c.CertFile}
}

// issue writes a client certificate carrying the URI SAN uri, signed by
// ca, and its key, into dir.
func (ca *testCA) issue(t *testing.T, dir, uri string) (certFile, keyFile string) {
	t.Helper()
	u, err := url.Parse(uri)
	if err != nil {
		t.Fatal(err)
	}
	c := brokertest.WriteCert(t, dir, "client", &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "dash"},
		URIs:         []*url.URL{u},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, ca.Cert)
	return c.CertFile, c.KeyFile
}

// TestMQTTEndpointClientCA: with the real binary and Mosquitto, a client
// admitted by a SAN its CA-issued certificate carries gets that entry's
// scope: a SUBSCRIBE outside it is refused and counted, one within it
// receives live messages within it only; a client with the same SAN from
// another CA is refused at the handshake (connector weida sub says so).
func TestMQTTEndpointClientCA(t *testing.T) {
	requireTCP(t, "Mosquitto", mosquittoAddr)
	u := unique()
	pub := mqttConnect(t, mosquittoAddr, "pub-"+u)
	dir := t.TempDir()
	ca, otherCA := newTestCA(t, dir, "client-ca"), newTestCA(t, dir, "other-ca")
	const san = "spiffe://plant-a/dash"
	aCert, aKey := ca.issue(t, t.TempDir(), san)
	xCert, xKey := otherCA.issue(t, t.TempDir(), san)

	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/plant", freePort(t, "udp"))
	res := mqttResource{
		Name: "mqtt-ca", Direction: policy.Inbound, QoS: 1, Endpoint: endpoint, CleanStart: true,
		Routes: []mqttRoute{{"all", u + "/#"}},
	}
	y := res.YAML(t)
	listen := "    listen: " + endpoint + "\n"
	if !strings.Contains(y, listen) {
		t.Fatalf("no listen line in\n%s", y)
	}
	y = strings.Replace(y, listen, listen+fmt.Sprintf("    clientCAFile: %s\n    allowedClients:\n      - san: %q\n        scopes: [%q]\n",
		ca.file, "uri:"+san, u+".plant.a.#"), 1)
	c := StartConnector(t, nil, "-f", writeFile(t, dir, "ca.yaml", y))
	c.WaitReady(30 * time.Second)

	a := collectWeidaAs(t, endpoint, aCert, aKey, u+".#", u+".plant.a.#")
	refused := `weida_connector_weida_scope_refusals_total{reason="not-covered",resource="mqtt-ca"}`
	Eventually(t, 10*time.Second, "the out-of-scope SUBSCRIBE refused", func() bool { return c.Metric(refused) == 1 })
	if !strings.Contains(c.Output(), "filter="+u+".#") || !strings.Contains(c.Output(), "uri:"+san) {
		t.Errorf("no refusal line naming the filter and the client's identity in the log:\n%s", c.Output())
	}
	Eventually(t, 10*time.Second, "probe at the CA-issued client", func() bool {
		pub.publish(t, 1, u+"/plant/a/probe", "probe")
		time.Sleep(100 * time.Millisecond)
		return a.hasPayload("probe")
	})
	pub.publish(t, 1, u+"/plant/b/y", "out-of-scope")
	pub.publish(t, 1, u+"/plant/a/x", "in-scope")
	Eventually(t, 10*time.Second, "in-scope at the CA-issued client", func() bool { return a.Has(u+".plant.a.x", "in-scope") })
	time.Sleep(300 * time.Millisecond) // plant.b.y, were it sent, was published first
	for _, m := range a.Messages() {
		if !strings.HasPrefix(m.Topic, u+".plant.a.") {
			t.Fatalf("the CA-issued client received %s", m.Topic)
		}
	}

	cctx := ctx(t, 20*time.Second)
	out, err := exec.CommandContext(cctx, connectorBin, "weida", "sub", endpoint, "--insecure-skip-verify-for-testing",
		"--filter", u+".plant.a.#", "--cert", xCert, "--key", xKey, "--dial-timeout", "5s", "--count", "1").CombinedOutput()
	if err == nil {
		t.Fatalf("a certificate of another CA was admitted:\n%s", out)
	}
	if !strings.Contains(string(out), "refused the client certificate") {
		t.Errorf("connector weida sub said:\n%s\nwant the refusal of its certificate", out)
	}
	Eventually(t, 10*time.Second, "the refusal logged", func() bool {
		return strings.Contains(c.Output(), "certificate not verified by the client CA")
	})
}
