package e2e

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"weida.dev/connector/connectors"
	"weida.dev/connector/connectors/mqtt"
	"weida.dev/connector/internal/brokertest"
)

// TestMQTTSinkRejections: a Mosquitto that refuses a QoS 1 publish for good
// (the ACL denies the topic; the payload is over message_size_limit) says so
// in its PUBACK, and the Sink reports a rejection the runtime counts at
// once, under publish-denied and too-large, instead of retrying it.
func TestMQTTSinkRejections(t *testing.T) {
	acl := filepath.Join(t.TempDir(), "acl")
	if err := os.WriteFile(acl, []byte("topic readwrite open/#\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	broker := brokertest.StartMosquitto(t, "acl_file "+acl, "message_size_limit 1000")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	host, port := brokertest.SplitAddr(t, broker.Addr())
	sink, err := mqtt.NewSink(mqtt.Config{Host: host, Port: port, ClientID: "reject-" + t.Name(), QoS: 1, CleanStart: true},
		func(connectors.ConnState) {})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close(context.Background())
	if err := sink.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		topic   string
		payload int
		reason  string // "" when the broker takes it
	}{
		{"open/a", 10, ""},
		{"closed/a", 10, connectors.ReasonPublishDenied},
		{"open/a", 2000, connectors.ReasonTooLarge},
	} {
		err := sink.Write(ctx, &connectors.Message{Topic: c.topic, Payload: make([]byte, c.payload)})
		var rj connectors.Rejected
		switch {
		case c.reason == "" && err != nil:
			t.Errorf("%s, %d bytes: %v", c.topic, c.payload, err)
		case c.reason != "" && (!errors.As(err, &rj) || rj.RejectReason() != c.reason):
			t.Errorf("%s, %d bytes: Write = %v, want a rejection as %s", c.topic, c.payload, err, c.reason)
		}
	}
}
