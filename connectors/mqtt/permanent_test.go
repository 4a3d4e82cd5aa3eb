package mqtt

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"weida.dev/connector/connectors"
	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
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

// TestRuntimeStopsRetryingOnMaximumQoS: through the runtime, the refused
// QoS is a failure for good: /status shows it as permanent, and no further
// attempt is made however short the backoff.
func TestRuntimeStopsRetryingOnMaximumQoS(t *testing.T) {
	b := brokertest.StartMosquitto(t, "max_qos 0")
	id := fmt.Sprintf("maxqos-rt-%08x", rand.Uint32())
	cfg := harness{t: t, addr: b.Addr()}.config(id, "")
	p := policy.MQTTLevelsV1()
	wf, err := p.ConvertFilter(id + "/#")
	if err != nil {
		t.Fatal(err)
	}
	rt := connectors.NewRuntime(connectors.Deps{
		Metrics: connectors.NewMetrics(prometheus.NewRegistry()),
		Backoff: func(int) time.Duration { return time.Millisecond },
	})
	defer rt.Stop()
	err = rt.Apply(context.Background(), []connectors.Unit{{
		Spec: connectors.Spec{Name: "out", Protocol: policy.MQTT, Direction: policy.Outbound, Policy: p,
			Routes: []connectors.Route{{Name: "r", Foreign: id + "/#", Weida: wf}}},
		Dial: func(context.Context) (*weida.Subscriber, error) { return nil, errors.New("not reached") },
		NewSink: func(report connectors.StateFunc) (connectors.Sink, error) {
			return NewSink(cfg, report)
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		st := rt.Statuses()
		if f := st[0].Failure; f != nil && f.Permanent {
			if f.Reason != "QoSNotSupported" {
				t.Fatalf("permanent failure %+v; want QoSNotSupported", f)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no permanent failure: %+v", st[0].Failure)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	if f := rt.Statuses()[0].Failure; f == nil || f.Attempts != 1 {
		t.Fatalf("failure after 300 ms: %+v; want the one attempt", f)
	}
}
