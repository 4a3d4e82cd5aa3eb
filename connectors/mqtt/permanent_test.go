package mqtt

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"weida.dev/connector/connectors"
	"weida.dev/connector/internal/brokertest"
)

// TestBrokerMaximumQoSIsPermanent: a broker whose CONNACK caps the QoS
// below the resource's (Mosquitto's max_qos) refuses the configuration for
// good: it would grant the subscriptions at QoS 0, an undeclared
// at-most-once loss, and disconnect at the first QoS 1 publish. Start
// returns a permanent failure naming what to change, and the runtime stops
// retrying until a reload. Before, Start succeeded and no driver ever
// returned a permanent failure.
func TestBrokerMaximumQoSIsPermanent(t *testing.T) {
	b := brokertest.StartMosquitto(t, "max_qos 0")
	id := fmt.Sprintf("maxqos-%08x", rand.Uint32())
	cfg := harness{t: t, addr: b.Addr()}.config(id, "")
	for _, side := range []string{"source", "sink"} {
		t.Run(side, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var start func() error
			var closer func(context.Context) error
			if side == "source" {
				src, err := NewSource(cfg, nil)
				if err != nil {
					t.Fatal(err)
				}
				start, closer = func() error { return src.Start(ctx, []string{id + "/#"}) }, src.Close
			} else {
				sink, err := NewSink(cfg, nil)
				if err != nil {
					t.Fatal(err)
				}
				start, closer = func() error { return sink.Start(ctx) }, sink.Close
			}
			defer closer(context.Background())
			err := start()
			var f *connectors.Failure
			if !errors.As(err, &f) || !f.Permanent || f.Reason != "QoSNotSupported" || !strings.Contains(err.Error(), "spec.broker.mqtt.qos") {
				t.Fatalf("Start = %v; want a permanent QoSNotSupported failure saying what to change", err)
			}
		})
	}
}
