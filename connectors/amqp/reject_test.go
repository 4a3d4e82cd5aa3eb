package amqp

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"weida.dev/connector/connectors"
)

// TestSinkRejectsDeniedPublish: a user who may declare the exchange but not
// write to it gets its publishes refused with 403, which closes the channel.
// Write reports a rejection (the runtime counts publish-denied at once)
// instead of a lost connection it would retry for ever.
func TestSinkRejectsDeniedPublish(t *testing.T) {
	requireBroker(t)
	user := fmt.Sprintf("weida-deny-%08x", rand.Uint32())
	rabbitmqctl(t, "add_user", user, "pw")
	t.Cleanup(func() { exec.Command("rabbitmqctl", "-q", "delete_user", user).Run() })
	rabbitmqctl(t, "set_permissions", "-p", "/", user, ".*", "^$", ".*") // configure, write, read

	cfg := testConfig("deny", "")
	cfg.Username, cfg.Password = user, "pw"
	cfg.Exchange = "weida.deny." + user
	sink, err := NewSink(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sink.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, ch := directChannel(t)
		ch.ExchangeDelete(cfg.Exchange, false, false)
	})
	err = sink.Write(ctx, &connectors.Message{Topic: "a.b", Payload: []byte("x")})
	var rj connectors.Rejected
	if !errors.As(err, &rj) || rj.RejectReason() != connectors.ReasonPublishDenied {
		t.Fatalf("Write = %v, want a rejection as %s", err, connectors.ReasonPublishDenied)
	}
}

// TestRejection: which channel errors reject which Writes.
func TestRejection(t *testing.T) {
	tooLarge := &amqp.Error{Code: amqp.PreconditionFailed, Server: true,
		Reason: "PRECONDITION_FAILED - message size 2000 is larger than configured max size 1000"}
	for _, c := range []struct {
		err    error
		size   int
		reason string // "" : not a rejection
	}{
		{&amqp.Error{Code: amqp.AccessRefused, Server: true, Reason: "ACCESS_REFUSED - access to exchange 'x' refused"}, 10, connectors.ReasonPublishDenied},
		{tooLarge, 2000, connectors.ReasonTooLarge},
		{tooLarge, 1000, ""}, // cut off by another Write's refusal: send again
		{&amqp.Error{Code: amqp.PreconditionFailed, Server: true, Reason: "PRECONDITION_FAILED - inequivalent arg"}, 10, ""},
		{&amqp.Error{Code: amqp.AccessRefused, Server: false}, 10, ""}, // raised by the library, not the broker
		{&amqp.Error{Code: amqp.ConnectionForced, Server: true}, 10, ""},
		{errors.New("connection closed"), 10, ""},
		{nil, 10, ""},
	} {
		got := rejection(c.err, c.size)
		var rj connectors.Rejected
		switch {
		case c.reason == "" && got != nil:
			t.Errorf("rejection(%v, %d) = %v, want none", c.err, c.size, got)
		case c.reason != "" && (!errors.As(got, &rj) || rj.RejectReason() != c.reason):
			t.Errorf("rejection(%v, %d) = %v, want %s", c.err, c.size, got, c.reason)
		}
	}
}

func rabbitmqctl(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("rabbitmqctl", append([]string{"-q"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl %v: %v\n%s", args, err, out)
	}
}
