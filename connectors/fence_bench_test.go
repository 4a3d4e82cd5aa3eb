package connectors

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// benchPublisher queues every message for one subscriber, at no cost.
type benchPublisher struct{}

func (benchPublisher) Publish(context.Context, weida.Message) (weida.Result, error) {
	return weida.Result{Matched: 1, Queued: 1}, nil
}
func (benchPublisher) Subscribers() int                                     { return 1 }
func (benchPublisher) Matches(string) bool                                  { return true }
func (benchPublisher) SubscriptionsChanged() <-chan struct{}                { return nil }
func (benchPublisher) OnCopiesLost(func(int))                               {}
func (benchPublisher) CountCopiesUnconfirmed(func(weida.UnconfirmedCopies)) {}

// BenchmarkInboundHandle is the inbound hot path of one message, from Read
// to its acknowledgement, without a broker or a weida peer: what a check
// on it (the fence) costs shows here.
func BenchmarkInboundHandle(b *testing.B) {
	run := func(b *testing.B, fence func() bool) {
		p := policy.NATSTokensV1()
		wf, err := p.ConvertFilter("in.*")
		if err != nil {
			b.Fatal(err)
		}
		spec := Spec{Name: "in", Protocol: policy.NATS, Direction: policy.Inbound, Policy: p,
			Routes: []Route{{Name: "r", Foreign: "in.*", Weida: wf}}}
		c := newCore(spec, Deps{Metrics: NewMetrics(prometheus.NewRegistry())})
		c.fence = fence
		in := newInboundBridge(c, nil, nil)
		in.setPublisher(benchPublisher{})
		ctx := context.Background()
		pub := in.publisher()
		m := Message{Topic: "in.a", Payload: []byte("payload")}
		ack := func(error) {}
		b.ReportAllocs()
		for b.Loop() {
			mm := m
			in.handle(ctx, pub, &mm, ack)
		}
	}
	b.Run("nofence", func(b *testing.B) { run(b, nil) })
	b.Run("fence", func(b *testing.B) { run(b, func() bool { return true }) })
}
