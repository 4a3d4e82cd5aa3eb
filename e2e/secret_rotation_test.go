package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// The tests of secret rotation (issue #22): a resource whose secret file
// is wrong when the connector starts retries with CredentialsRefused; the
// test then corrects the file, sends no signal, and the resource must be
// Ready within secretFixedWithin. The connector runs with its default
// backoff: what makes it prompt is that every attempt reads the secret
// again, that a waiting unit starts its next attempt as soon as the file
// changes, and (MQTT) that autopaho's reconnections read it too.
const secretFixedWithin = 20 * time.Second

// replaceFile writes content to path by a rename over it, as a Kubernetes
// Secret update or an editor does.
func replaceFile(t testing.TB, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// waitFixed waits for the resource to recover after its secret was
// corrected at fixed, and checks the bound.
func waitFixed(t *testing.T, c *Connector, name string, fixed time.Time) {
	t.Helper()
	c.WaitRecovered(name, secretFixedWithin+10*time.Second)
	took := time.Since(fixed)
	t.Logf("%s Ready %s after its secret file was corrected, with no signal", name, took.Round(time.Millisecond))
	if took > secretFixedWithin {
		t.Errorf("%s took %s to recover after its secret file was corrected; want at most %s", name, took, secretFixedWithin)
	}
	if strings.Contains(c.Output(), "reloading resources") {
		t.Error("the connector reloaded; the test sent no signal and changed no resource file")
	}
}

// TestSecretRotationMQTT: a private Mosquitto with a password file; the
// resource's password file is wrong at start, then corrected.
func TestSecretRotationMQTT(t *testing.T) {
	dir := t.TempDir()
	right := "right-" + unique()
	pwfile := filepath.Join(dir, "mosquitto.passwd")
	if out, err := exec.Command("mosquitto_passwd", "-b", "-c", pwfile, "bridge", right).CombinedOutput(); err != nil {
		t.Fatalf("mosquitto_passwd: %v\n%s", err, out)
	}
	// Anonymous clients (the test's publisher) stay allowed; a client
	// naming user bridge must give its password.
	broker := brokertest.StartMosquitto(t, "password_file "+pwfile)
	secret := writeFile(t, dir, "password", "wrong\n")
	u := unique()
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/rot", freePort(t, "udp"))
	res := mqttResource{Name: "rot-mqtt", Direction: policy.Inbound, Broker: broker.Addr(), QoS: 1,
		Endpoint: endpoint, Routes: []mqttRoute{{"r", u + "/+"}}}
	yaml := strings.Replace(res.YAML(t), "    mqtt:\n",
		"    credentials:\n      username: bridge\n      password: {file: "+secret+"}\n    mqtt:\n", 1)
	c := StartConnector(t, nil, "-f", writeFile(t, dir, "r.yaml", yaml))
	// While the first attempt's Start waits, autopaho retries and the
	// broker condition says why; the attempt then fails with it.
	c.WaitFailure(res.Name, "CredentialsRefused", 1, 60*time.Second)

	fixed := time.Now()
	replaceFile(t, secret, right+"\n")
	waitFixed(t, c, res.Name, fixed)

	pub := mqttConnect(t, broker.Addr(), "pub-"+u)
	sub := collectWeida(t, endpoint, weida.Limits{}, "#")
	sub.Sync(20*time.Second, "probe-"+u, func() { pub.publish(t, 1, u+"/probe", "probe-"+u) })
}

// TestSecretRotationNATS: a private nats-server with a token; the
// resource's token file is wrong at start, then removed (SecretUnavailable,
// retried), then corrected.
func TestSecretRotationNATS(t *testing.T) {
	token := "tok-" + unique()
	srv := brokertest.StartNATS(t, "--auth", token)
	dir := t.TempDir()
	tokenFile := writeFile(t, dir, "token", "wrong\n")
	u := unique()
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/rot", freePort(t, "udp"))
	res := natsResource{Name: "rot-nats", Direction: policy.Inbound, Broker: srv.Addr(), Endpoint: endpoint,
		TokenFile: tokenFile, Routes: []string{u + ".rot.*"}}
	c := StartConnector(t, nil, "-f", writeFile(t, dir, "r.yaml", res.YAML(t)))
	c.WaitFailure(res.Name, "CredentialsRefused", 3, 60*time.Second)

	if err := os.Remove(tokenFile); err != nil {
		t.Fatal(err)
	}
	st := c.WaitFailure(res.Name, "SecretUnavailable", 1, 60*time.Second)
	if !strings.Contains(st.Failure.Message, tokenFile) {
		t.Errorf("the SecretUnavailable failure does not name the file %s: %q", tokenFile, st.Failure.Message)
	}

	fixed := time.Now()
	replaceFile(t, tokenFile, token+"\n")
	waitFixed(t, c, res.Name, fixed)

	pub := natsConn(t, srv.Addr(), natsgo.Token(token))
	sub := collectWeida(t, endpoint, weida.Limits{}, "#")
	sub.Sync(20*time.Second, "probe", func() {
		if err := pub.Publish(u+".rot.probe", []byte("probe")); err != nil {
			t.Fatal(err)
		}
		pub.Flush()
	})
}

// TestSecretRotationAMQP: the loopback RabbitMQ's guest user, with a
// password file that is wrong at start, then corrected.
func TestSecretRotationAMQP(t *testing.T) {
	requireTCP(t, "RabbitMQ", rabbitAddr)
	dir := t.TempDir()
	pwFile := writeFile(t, dir, "password", "not-guest\n")
	u := unique()
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/rot", freePort(t, "udp"))
	res := amqpResource{Name: "rot-amqp", Direction: policy.Inbound, Endpoint: endpoint,
		Routes: []amqpRoute{{"r", u + ".rot.*"}}}
	yaml := strings.Replace(res.YAML(t), "password: {env: AMQP_PASSWORD}", "password: {file: "+pwFile+"}", 1)
	c := StartConnector(t, nil, "-f", writeFile(t, dir, "r.yaml", yaml))
	c.WaitFailure(res.Name, "CredentialsRefused", 3, 60*time.Second)

	fixed := time.Now()
	replaceFile(t, pwFile, "guest\n")
	waitFixed(t, c, res.Name, fixed)

	pub := amqpConnect(t, rabbitAddr)
	sub := collectWeida(t, endpoint, weida.Limits{}, "#")
	sub.Sync(20*time.Second, "probe", func() { pub.mustPublish(t, "amq.topic", u+".rot.probe", "probe") })
}

// TestSecretRotationMQTTWhileRunning: the rotation of a running resource.
// The broker's password for the connector's user changes and so does the
// secret file, while the connection stays up on the old one (rotation
// applies at the next connection); when the broker restarts, the
// connector's reconnection within the same attempt uses the new password
// and the resource bridges again, with no signal.
func TestSecretRotationMQTTWhileRunning(t *testing.T) {
	dir := t.TempDir()
	pwfile := filepath.Join(dir, "mosquitto.passwd")
	passwd := func(pw string) {
		t.Helper()
		args := []string{"-b", pwfile, "bridge", pw}
		if _, err := os.Stat(pwfile); err != nil {
			args = append([]string{"-c"}, args...)
		}
		if out, err := exec.Command("mosquitto_passwd", args...).CombinedOutput(); err != nil {
			t.Fatalf("mosquitto_passwd: %v\n%s", err, out)
		}
	}
	oldPW, newPW := "old-"+unique(), "new-"+unique()
	passwd(oldPW)
	broker := brokertest.StartMosquitto(t, "password_file "+pwfile)
	secret := writeFile(t, dir, "password", oldPW+"\n")
	u := unique()
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/rot", freePort(t, "udp"))
	res := mqttResource{Name: "rot-run", Direction: policy.Inbound, Broker: broker.Addr(), QoS: 1,
		Endpoint: endpoint, Routes: []mqttRoute{{"r", u + "/+"}}}
	yaml := strings.Replace(res.YAML(t), "    mqtt:\n",
		"    credentials:\n      username: bridge\n      password: {file: "+secret+"}\n    mqtt:\n", 1)
	c := StartConnector(t, nil, "-f", writeFile(t, dir, "r.yaml", yaml))
	c.WaitReady(30 * time.Second)
	before, _ := c.Status(res.Name)

	passwd(newPW)
	replaceFile(t, secret, newPW+"\n")
	broker.Restart() // reads the new password file; the connector's connection drops
	restarted := time.Now()
	Eventually(t, secretFixedWithin, "the resource to reconnect with the new password", func() bool {
		st, _ := c.Status(res.Name)
		return st.ready() && st.Counters.Reconnects > before.Counters.Reconnects
	})
	t.Logf("reconnected with the rotated password %s after the broker restart", time.Since(restarted).Round(time.Millisecond))
	pub := mqttConnect(t, broker.Addr(), "pub-"+u)
	sub := collectWeida(t, endpoint, weida.Limits{}, "#")
	sub.Sync(20*time.Second, "probe-"+u, func() { pub.publish(t, 1, u+"/probe", "probe-"+u) })
}
