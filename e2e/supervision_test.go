package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"syscall"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// The tests of this file start each resource while something it needs is
// missing (a stream, a UDP port, the right credentials, an exchange), check
// that the connector stays alive and reports why the resource is down, then
// remove the cause and check that the resource comes up by itself and
// bridges.

// fastRetry makes the connector retry a failed resource every second at
// most, so that a recovery shows within a few polls.
func fastRetry(args ...string) []string {
	return append([]string{"--retry-initial", "100ms", "--retry-max", "1s"}, args...)
}

// adminView is one look at a connector's admin endpoints. /status is read
// before and after the probes, so that a resource that was down in both
// reads was down while /readyz/{resource} answered.
type adminView struct {
	// HTTP status codes; 0 when the request failed. Resource is
	// /readyz/{resource} of the resource the view was taken for.
	Healthz, Readyz, Resource int
	Ready                     bool
	Before, After             []ResourceStatus
}

func find(rs []ResourceStatus, name string) (ResourceStatus, bool) {
	for _, r := range rs {
		if r.Name == name {
			return r, true
		}
	}
	return ResourceStatus{}, false
}

// statusDoc reads /status. A transport error is returned as such; a body
// that is not the documented JSON fails the test at once, with the body,
// since waiting would only hide it.
func (c *Connector) statusDoc() (ready bool, rs []ResourceStatus, err error) {
	c.t.Helper()
	resp, err := http.Get("http://" + c.Admin + "/status")
	if err != nil {
		return false, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return false, nil, err
	}
	var doc struct {
		Ready     bool             `json:"ready"`
		Resources []ResourceStatus `json:"resources"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		c.t.Fatalf("/status (HTTP %d) is not the documented JSON: %v\n%s", resp.StatusCode, err, body)
	}
	return doc.Ready, doc.Resources, nil
}

func (c *Connector) code(path string) int {
	resp, err := http.Get("http://" + c.Admin + path)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// view reads /status, /readyz, /readyz/{name}, /healthz and /status again.
func (c *Connector) view(name string) (adminView, error) {
	c.t.Helper()
	var v adminView
	var err error
	if _, v.Before, err = c.statusDoc(); err != nil {
		return v, err
	}
	v.Readyz = c.code("/readyz")
	v.Resource = c.code("/readyz/" + url.PathEscape(name))
	v.Healthz = c.code("/healthz")
	if v.Ready, v.After, err = c.statusDoc(); err != nil {
		return v, err
	}
	return v, nil
}

// alive fails the test when the process has exited: every failure these
// tests provoke must leave it running.
func (c *Connector) alive() {
	c.t.Helper()
	select {
	case <-c.done:
		c.t.Fatalf("connector exited (%v) while it should keep running (its output follows)", c.err)
	default:
	}
}

// pollSupervised polls the admin endpoints every 50 ms until done accepts
// the named resource or d passes. On every poll once the admin listener has
// answered, it asserts what holds whatever a resource's state: /healthz
// answers 200 (a resource being down never fails liveness), /readyz
// answers 200 once it has (a resource never takes the process's readiness), and /readyz/{resource}
// answers 503 while the resource is not Ready.
func (c *Connector) pollSupervised(name string, d time.Duration, what string, done func(adminView, ResourceStatus) bool) ResourceStatus {
	c.t.Helper()
	deadline := time.Now().Add(d)
	answered, loaded := false, false
	for {
		c.alive()
		v, err := c.view(name)
		switch {
		case err != nil && answered:
			c.t.Fatalf("the admin listener stopped answering while waiting for %s: %v", what, err)
		case err == nil:
			answered = true
			if v.Healthz != http.StatusOK {
				c.t.Fatalf("/healthz answered %d while waiting for %s; status:\n%s", v.Healthz, what, c.StatusJSON())
			}
			// /readyz is 503 only until the process has loaded its
			// resources; after that, nothing a resource does changes it.
			loaded = loaded || v.Readyz == http.StatusOK
			if loaded && v.Readyz != http.StatusOK {
				c.t.Fatalf("/readyz answered %d while waiting for %s: a resource being down must not make the process unready; status:\n%s", v.Readyz, what, c.StatusJSON())
			}
			before, ok1 := find(v.Before, name)
			after, ok2 := find(v.After, name)
			if ok1 && ok2 && !before.ready() && !after.ready() && v.Resource != http.StatusServiceUnavailable {
				c.t.Fatalf("/readyz/%s answered %d while %s was not Ready (waiting for %s); status:\n%s", name, v.Resource, name, what, c.StatusJSON())
			}
			if ok2 && done(v, after) {
				return after
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("timed out after %s waiting for %s; status:\n%s", d, what, c.StatusJSON())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// WaitFailure waits until the named resource reports a failure with this
// reason after at least minAttempts attempts, and checks what the contract
// says of a resource that is down and retrying: its Ready condition is
// False with the failure's reason, the failure is not permanent and says
// when it happened and when the next attempt is due, /readyz/{resource}
// answers 503 and /status is not ready.
func (c *Connector) WaitFailure(name, reason string, minAttempts int, d time.Duration) ResourceStatus {
	c.t.Helper()
	var view adminView
	st := c.pollSupervised(name, d, fmt.Sprintf("%s to report failure %s after %d attempts", name, reason, minAttempts),
		func(v adminView, st ResourceStatus) bool {
			view = v
			return st.Failure != nil && st.Failure.Reason == reason && st.Failure.Attempts >= minAttempts
		})
	f := st.Failure
	if status, why := condition(st, "Ready"); status != "False" || why != reason {
		c.t.Errorf("while failing with %s, %s's Ready condition is %s/%s; want False/%s", reason, name, status, why, reason)
	}
	if f.Permanent {
		c.t.Errorf("failure %s of %s is marked permanent; the connector must keep retrying it", reason, name)
	}
	if f.Message == "" || f.LastErrorTime.IsZero() || f.NextRetryTime.IsZero() {
		c.t.Errorf("failure of %s lacks a message, lastErrorTime or nextRetryTime: %+v", name, *f)
	}
	if view.Ready || view.Resource != http.StatusServiceUnavailable {
		c.t.Errorf("while %s is down: /status ready=%t, /readyz/%s %d; want false and 503", name, view.Ready, name, view.Resource)
	}
	return st
}

// WaitRecovered waits until the named resource is Ready with no failure
// and /readyz/{resource} answers 200 (each test runs one resource),
// asserting /healthz and /readyz on the way as pollSupervised does.
func (c *Connector) WaitRecovered(name string, d time.Duration) ResourceStatus {
	c.t.Helper()
	return c.pollSupervised(name, d, name+" to recover and the connector to be ready",
		func(v adminView, st ResourceStatus) bool {
			return st.ready() && st.Failure == nil && v.Ready && v.Resource == http.StatusOK
		})
}

// jsPublisher returns a function publishing to a JetStream stream, failing
// the test unless the stream acknowledges.
func jsPublisher(t *testing.T, js jetstream.JetStream) func(subject, payload string) {
	return func(subject, payload string) {
		t.Helper()
		pctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := js.Publish(pctx, subject, []byte(payload)); err != nil {
			t.Fatalf("publishing %q to JetStream: %v", subject, err)
		}
	}
}

// TestSupervisionJetStreamStreamAppears: an inbound JetStream resource
// whose stream does not exist yet reports StreamMissing and keeps trying;
// once the operator creates the stream, it binds its durable consumer by
// itself, with no signal, and bridges what the stream holds.
func TestSupervisionJetStreamStreamAppears(t *testing.T) {
	requireTCP(t, "nats-server", natsAddr)
	u := unique()
	stream, durable := "SUP_"+u, "sup-"+u
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/js", freePort(t, "udp"))
	res := natsResource{Name: "sup-js", Direction: policy.Inbound, Endpoint: endpoint,
		Stream: stream, Durable: durable, Routes: []string{u + ".sup.*"}}
	c := StartConnector(t, nil, fastRetry("-f", writeFile(t, t.TempDir(), "js.yaml", res.YAML(t)))...)
	c.WaitFailure(res.Name, "StreamMissing", 2, 20*time.Second)

	publish := jsPublisher(t, createStream(t, natsConn(t, natsAddr), stream, u+".sup.>"))
	c.WaitRecovered(res.Name, 20*time.Second)
	sub := collectWeida(t, endpoint, weida.Limits{}, "#")
	sub.Sync(20*time.Second, "probe", func() { publish(u+".sup.probe", "probe") })
	publish(u+".sup.1", "after the stream appeared")
	Eventually(t, 20*time.Second, "the stream's message at the weida subscriber", func() bool {
		return sub.Has(u+".sup.1", "after the stream appeared")
	})
}

// TestSupervisionListenPortFreed: an inbound resource whose weida UDP port
// another socket holds reports ListenFailed and keeps trying; once the port
// is free, it listens and bridges.
func TestSupervisionListenPortFreed(t *testing.T) {
	requireTCP(t, "nats-server", natsAddr)
	holder, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Close() }) // a second Close only returns an error
	u := unique()
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/x", holder.LocalAddr().(*net.UDPAddr).Port)
	res := natsResource{Name: "sup-port", Direction: policy.Inbound, Endpoint: endpoint, Routes: []string{u + ".port.*"}}
	c := StartConnector(t, nil, fastRetry("-f", writeFile(t, t.TempDir(), "port.yaml", res.YAML(t)))...)
	c.WaitFailure(res.Name, "ListenFailed", 2, 20*time.Second)

	if err := holder.Close(); err != nil {
		t.Fatal(err)
	}
	c.WaitRecovered(res.Name, 20*time.Second)
	sub := collectWeida(t, endpoint, weida.Limits{}, "#")
	pub := natsConn(t, natsAddr)
	send := func(subject, payload string) {
		t.Helper()
		if err := pub.Publish(subject, []byte(payload)); err != nil {
			t.Fatal(err)
		}
		if err := pub.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	sub.Sync(20*time.Second, "probe", func() { send(u+".port.probe", "probe") })
	send(u+".port.1", "after the port was freed")
	Eventually(t, 20*time.Second, "the message at the weida subscriber", func() bool {
		return sub.Has(u+".port.1", "after the port was freed")
	})
}

// TestSupervisionCredentialsAccepted: a resource whose NATS token the
// server refuses reports CredentialsRefused and keeps trying; once the
// server's configuration accepts that token (a server reload, nothing sent
// to the connector), the resource connects by itself and bridges.
func TestSupervisionCredentialsAccepted(t *testing.T) {
	dir := t.TempDir()
	conf := writeFile(t, dir, "auth.conf", "authorization { token: \"A\" }\n")
	srv := brokertest.StartNATS(t, "-c", conf)
	u := unique()
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/cred", freePort(t, "udp"))
	res := natsResource{Name: "sup-cred", Direction: policy.Inbound, Broker: srv.Addr(), Endpoint: endpoint,
		TokenFile: writeFile(t, dir, "token", "B\n"), Routes: []string{u + ".cred.*"}}
	c := StartConnector(t, nil, fastRetry("-f", writeFile(t, dir, "cred.yaml", res.YAML(t)))...)
	c.WaitFailure(res.Name, "CredentialsRefused", 2, 20*time.Second)

	writeFile(t, dir, "auth.conf", "authorization { token: \"B\" }\n")
	srv.Signal(syscall.SIGHUP)
	// The reload is asynchronous: the test's own client with token B
	// tells when the server applied it.
	var pub *natsgo.Conn
	Eventually(t, 20*time.Second, "the private nats-server to accept token B", func() bool {
		nc, err := natsgo.Connect("nats://"+srv.Addr(), natsgo.Token("B"))
		if err != nil {
			return false
		}
		pub = nc
		return true
	})
	t.Cleanup(pub.Close)
	c.WaitRecovered(res.Name, 20*time.Second)
	sub := collectWeida(t, endpoint, weida.Limits{}, "#")
	send := func(subject, payload string) {
		t.Helper()
		if err := pub.Publish(subject, []byte(payload)); err != nil {
			t.Fatal(err)
		}
		if err := pub.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	sub.Sync(20*time.Second, "probe", func() { send(u+".cred.probe", "probe") })
	send(u+".cred.1", "with the accepted token")
	Eventually(t, 20*time.Second, "the message at the weida subscriber", func() bool {
		return sub.Has(u+".cred.1", "with the accepted token")
	})
}

// TestSupervisionPassiveExchangeAppears: an outbound AMQP resource told to
// use an exchange as it exists (exchangePassive) reports
// DeclarationRefused while the exchange is missing and keeps trying; once
// the operator declares it, the resource publishes a weida message to it.
func TestSupervisionPassiveExchangeAppears(t *testing.T) {
	requireTCP(t, "RabbitMQ", rabbitAddr)
	u := unique()
	exchange := "e2e-sup-" + u
	wpub, url := weidaPublisher(t, "/sup")
	res := amqpResource{Name: "sup-amqp", Direction: policy.Outbound, Exchange: exchange, ExchangePassive: true,
		Endpoint: url, Routes: []amqpRoute{{"sup", "sup.#"}}}
	c := StartConnector(t, amqpEnv, fastRetry("-f", writeFile(t, t.TempDir(), "amqp.yaml", res.YAML(t)))...)
	c.WaitFailure(res.Name, "DeclarationRefused", 2, 20*time.Second)

	amqpConnect(t, rabbitAddr).declareExchange(t, exchange) // deleted when the test ends
	got := amqpCollect(t, rabbitAddr, exchange, "sup.#")
	c.WaitRecovered(res.Name, 20*time.Second)
	waitSubscribers(t, wpub, 1, 20*time.Second)
	// The connector's weida SUBSCRIBE has no acknowledgement: publish until
	// one copy crosses.
	Eventually(t, 20*time.Second, "a weida message at the queue bound to the exchange", func() bool {
		if _, err := wpub.Publish(ctx(t, 5*time.Second), weida.Message{Topic: "sup.crossed", Payload: []byte("crossed")}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
		return got.Len() > 0
	})
	if d := got.Messages()[0]; d.Exchange != exchange || d.RoutingKey != "sup.crossed" || string(d.Body) != "crossed" {
		t.Errorf("delivery: exchange %q, routing key %q, body %q; want %q, sup.crossed, crossed", d.Exchange, d.RoutingKey, d.Body, exchange)
	}
}

// TestSupervisionSIGHUPRestartsFailedUnit: SIGHUP recreates a resource that
// is down even though its file did not change, without waiting for the
// retry its backoff scheduled.
func TestSupervisionSIGHUPRestartsFailedUnit(t *testing.T) {
	requireTCP(t, "nats-server", natsAddr)
	u := unique()
	stream, durable := "SUPHUP_"+u, "suphup-"+u
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/hup", freePort(t, "udp"))
	res := natsResource{Name: "sup-hup", Direction: policy.Inbound, Endpoint: endpoint,
		Stream: stream, Durable: durable, Routes: []string{u + ".hup.*"}}
	c := StartConnector(t, nil, "--retry-initial", "20s", "--retry-max", "20s",
		"-f", writeFile(t, t.TempDir(), "hup.yaml", res.YAML(t)))
	// Jitter may schedule a retry sooner than 20 s: wait for a failure
	// whose next attempt is far enough away that only the SIGHUP can
	// explain a recovery within a few seconds.
	const margin = 8 * time.Second
	st := c.WaitFailure(res.Name, "StreamMissing", 1, 20*time.Second)
	for i := 0; time.Until(st.Failure.NextRetryTime) < margin; i++ {
		if i == 3 {
			t.Fatalf("with --retry-initial 20s, none of %d failures scheduled its next attempt %s ahead: %+v", st.Failure.Attempts, margin, *st.Failure)
		}
		st = c.WaitFailure(res.Name, "StreamMissing", st.Failure.Attempts+1, 30*time.Second)
	}
	next := st.Failure.NextRetryTime

	publish := jsPublisher(t, createStream(t, natsConn(t, natsAddr), stream, u+".hup.>"))
	c.Signal(syscall.SIGHUP)
	t.Logf("SIGHUP at %s; the backoff had scheduled the next attempt at %s", time.Now().Format(time.RFC3339Nano), next.Format(time.RFC3339Nano))
	c.WaitRecovered(res.Name, time.Until(next)-time.Second)
	sub := collectWeida(t, endpoint, weida.Limits{}, "#")
	sub.Sync(20*time.Second, "probe", func() { publish(u+".hup.probe", "probe") })
}
