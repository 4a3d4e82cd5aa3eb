package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	natsgo "github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// brokerPKI is a throw-away certificate authority with a server
// certificate for 127.0.0.1 and a client certificate, as files, for the
// brokers' TLS listeners and the resources that connect to them.
type brokerPKI struct {
	CA, ServerCert, ServerKey, ClientCert, ClientKey string
	pool                                             *x509.CertPool
}

func newBrokerPKI(t testing.TB) *brokerPKI {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "e2e broker CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	p := &brokerPKI{CA: filepath.Join(dir, "ca.pem"), pool: x509.NewCertPool()}
	p.pool.AddCert(caCert)
	writePEM(t, p.CA, "CERTIFICATE", caDER)
	issue := func(name string, serial int64, usage x509.ExtKeyUsage) (certFile, keyFile string) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "e2e " + name},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		certFile, keyFile = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+".key")
		writePEM(t, certFile, "CERTIFICATE", der)
		writePEM(t, keyFile, "EC PRIVATE KEY", kder)
		return certFile, keyFile
	}
	p.ServerCert, p.ServerKey = issue("server", 2, x509.ExtKeyUsageServerAuth)
	p.ClientCert, p.ClientKey = issue("client", 3, x509.ExtKeyUsageClientAuth)
	return p
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// clientTLS is what a test's own broker client presents.
func (p *brokerPKI) clientTLS(t testing.TB) *tls.Config {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(p.ClientCert, p.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{RootCAs: p.pool, Certificates: []tls.Certificate{cert}, ServerName: "127.0.0.1"}
}

// yaml is the resource's spec.broker.tls block; nil writes nothing.
func (p *brokerPKI) yaml() string {
	if p == nil {
		return ""
	}
	s := fmt.Sprintf("    tls:\n      caFile: %s\n", p.CA)
	if p.ClientCert != "" {
		s += fmt.Sprintf("      certFile: %s\n      keyFile: %s\n", p.ClientCert, p.ClientKey)
	}
	return s
}

// TestNATSTLS: a resource with a tls:// URL, the broker's CA and a client
// certificate bridges from a nats-server that requires TLS and verifies
// client certificates; one without the client certificate is refused by
// the server (TLS 1.3 tells the client only after the handshake: as the
// server's alert, or as a closed connection, whichever the client reads
// first) and its status says so instead of becoming ready.
func TestNATSTLS(t *testing.T) {
	pki := newBrokerPKI(t)
	srv := brokertest.StartNATS(t, "--tls", "--tlscert", pki.ServerCert, "--tlskey", pki.ServerKey,
		"--tlscacert", pki.CA, "--tlsverify")
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/tls", freePort(t, "udp"))
	res := natsResource{Name: "nats-tls", Direction: policy.Inbound, Broker: srv.Addr(), Endpoint: endpoint,
		Routes: []string{"tls.*"}, TLS: pki}
	c := StartConnector(t, nil, "-f", writeFile(t, t.TempDir(), "tls.yaml", res.YAML(t)))
	c.WaitReady(30 * time.Second)
	sub := collectWeida(t, endpoint, weida.Limits{}, "#")
	pub := natsConn(t, srv.Addr(), natsgo.Secure(pki.clientTLS(t)))
	sub.Sync(20*time.Second, "over tls", func() {
		if err := pub.Publish("tls.probe", []byte("over tls")); err != nil {
			t.Fatal(err)
		}
	})

	// Without the client certificate.
	bare := *pki
	bare.ClientCert, bare.ClientKey = "", ""
	res = natsResource{Name: "nats-tls-nocert", Direction: policy.Inbound, Broker: srv.Addr(),
		Endpoint: fmt.Sprintf("weida://127.0.0.1:%d/tls", freePort(t, "udp")), Routes: []string{"tls.*"}, TLS: &bare}
	c2 := StartConnector(t, nil, "-f", writeFile(t, t.TempDir(), "tls.yaml", res.YAML(t)))
	t.Logf("without a client certificate: %s", brokerRefusal(t, c2, "nats-tls-nocert", "tls", 20*time.Second))
}

// TestMQTTTLS: the same for MQTT: an mqtts:// resource bridges from a
// Mosquitto listener that requires a client certificate, and one without
// its certificate reports the refusal instead of becoming ready.
func TestMQTTTLS(t *testing.T) {
	pki := newBrokerPKI(t)
	broker := brokertest.StartMosquitto(t, "cafile "+pki.CA, "certfile "+pki.ServerCert, "keyfile "+pki.ServerKey,
		"require_certificate true")
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/tls", freePort(t, "udp"))
	res := mqttResource{Name: "mqtt-tls", Direction: policy.Inbound, Broker: broker.Addr(), QoS: 1, Endpoint: endpoint,
		Routes: []mqttRoute{{"t", "tls/+"}}, TLS: pki}
	c := StartConnector(t, nil, "-f", writeFile(t, t.TempDir(), "tls.yaml", res.YAML(t)))
	c.WaitReady(30 * time.Second)
	sub := collectWeida(t, endpoint, weida.Limits{}, "#")
	conn, err := tls.Dial("tcp", broker.Addr(), pki.clientTLS(t))
	if err != nil {
		t.Fatal(err)
	}
	pub := paho.NewClient(paho.ClientConfig{ClientID: "tls-pub-" + unique(), Conn: conn})
	if _, err := pub.Connect(ctx(t, 10*time.Second), &paho.Connect{ClientID: "tls-pub", CleanStart: true, KeepAlive: 30}); err != nil {
		t.Fatal(err)
	}
	defer pub.Disconnect(&paho.Disconnect{})
	sub.Sync(20*time.Second, "over tls", func() {
		if _, err := pub.Publish(ctx(t, 10*time.Second), &paho.Publish{Topic: "tls/probe", QoS: 1, Payload: []byte("over tls")}); err != nil {
			t.Fatal(err)
		}
	})

	bare := *pki
	bare.ClientCert, bare.ClientKey = "", ""
	res = mqttResource{Name: "mqtt-tls-nocert", Direction: policy.Inbound, Broker: broker.Addr(), QoS: 1,
		Endpoint: fmt.Sprintf("weida://127.0.0.1:%d/tls", freePort(t, "udp")), Routes: []mqttRoute{{"t", "tls/+"}}, TLS: &bare}
	c2 := StartConnector(t, nil, "-f", writeFile(t, t.TempDir(), "tls.yaml", res.YAML(t)))
	t.Logf("without a client certificate: %s", brokerRefusal(t, c2, "mqtt-tls-nocert", "certificate required", 20*time.Second))
	if st, _ := c2.Status("mqtt-tls-nocert"); st.Counters.Received != 0 {
		t.Errorf("a resource the broker refused received messages: %+v", st.Counters)
	}
}

// TestAMQPTLS: the same for RabbitMQ: an amqps:// resource bridges from a
// TLS listener that requires a client certificate, and one without its
// certificate reports the refusal instead of becoming ready.
func TestAMQPTLS(t *testing.T) {
	pki := newBrokerPKI(t)
	// The node runs as the rabbitmq user, which must read the server's
	// key: a throw-away key of this test, so readable by all is fine (the
	// test's temporary directory too, which it must traverse).
	if err := os.Chmod(filepath.Dir(filepath.Dir(pki.CA)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := filepath.WalkDir(filepath.Dir(pki.CA), func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		mode := os.FileMode(0o644)
		if d.IsDir() {
			mode = 0o755
		}
		return os.Chmod(path, mode)
	}); err != nil {
		t.Fatal(err)
	}
	tlsPort := freePort(t, "tcp")
	brokertest.StartRabbit(t,
		fmt.Sprintf("listeners.ssl.default = 127.0.0.1:%d", tlsPort),
		"ssl_options.cacertfile = "+pki.CA,
		"ssl_options.certfile = "+pki.ServerCert,
		"ssl_options.keyfile = "+pki.ServerKey,
		"ssl_options.verify = verify_peer",
		"ssl_options.fail_if_no_peer_cert = true")
	tlsAddr := fmt.Sprintf("127.0.0.1:%d", tlsPort)
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/tls", freePort(t, "udp"))
	res := amqpResource{Name: "amqp-tls", Direction: policy.Inbound, Broker: tlsAddr, Exchange: "tls-" + unique(),
		Endpoint: endpoint, Routes: []amqpRoute{{"t", "tls.*"}}, TLS: pki}
	env := []string{"AMQP_PASSWORD=guest"}
	c := StartConnector(t, env, "-f", writeFile(t, t.TempDir(), "tls.yaml", res.YAML(t)))
	c.WaitReady(60 * time.Second)
	sub := collectWeida(t, endpoint, weida.Limits{}, "#")
	conn, err := amqp.DialTLS("amqps://guest:guest@"+tlsAddr+"/", pki.clientTLS(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	sub.Sync(20*time.Second, "over tls", func() {
		if err := ch.Publish(res.Exchange, "tls.probe", false, false, amqp.Publishing{Body: []byte("over tls")}); err != nil {
			t.Fatal(err)
		}
	})

	bare := *pki
	bare.ClientCert, bare.ClientKey = "", ""
	res = amqpResource{Name: "amqp-tls-nocert", Direction: policy.Inbound, Broker: tlsAddr, Exchange: res.Exchange,
		Endpoint: fmt.Sprintf("weida://127.0.0.1:%d/tls", freePort(t, "udp")), Routes: []amqpRoute{{"t", "tls.*"}}, TLS: &bare}
	c2 := StartConnector(t, env, "-f", writeFile(t, t.TempDir(), "tls.yaml", res.YAML(t)))
	t.Logf("without a client certificate: %s", brokerRefusal(t, c2, "amqp-tls-nocert", "", 30*time.Second))
}

// brokerRefusal waits until the resource's BrokerConnected condition is
// False with a message that holds want, and returns its reason and message.
func brokerRefusal(t *testing.T, c *Connector, resource, want string, d time.Duration) string {
	t.Helper()
	var last string
	Eventually(t, d, resource+"'s refused connection reported", func() bool {
		st, ok := c.Status(resource)
		if !ok || len(st.Conditions) == 0 {
			return false
		}
		cond := st.Conditions[0]
		last = cond.Reason + ": " + cond.Message
		return cond.Status == "False" && cond.Message != "" && strings.Contains(cond.Message, want)
	})
	return last
}
