package e2e

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"weida.dev/connector/connectors"
	natsconn "weida.dev/connector/connectors/nats"
	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// The NATS rigs share one server: each has its own first token, so that no
// rig's subscriber sees another rig's messages. "<rig>.*.data" selects
// "<rig>.x.data"; the outbound rig, whose subjects come from weida's
// benchSubject, uses "bench".
func natsBenchFilter(rig string) string  { return rig + ".*.data" }
func natsBenchSubject(rig string) string { return rig + ".x.data" }

// natsDirectRig: a nats.go publisher and a wildcard subscriber on another
// connection, as in reference/broker-baselines.md.
func natsDirectRig(t *testing.T, addr string) *benchRig {
	pub := natsConn(t, addr)
	sub := natsConn(t, addr)
	rig := &benchRig{name: "nats-server direct", delivered: make(chan struct{}, benchWindow)}
	done := make(chan struct{})
	s, err := sub.Subscribe(natsBenchFilter("direct"), func(m *natsgo.Msg) { rig.arrived(m.Data, done) })
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetPendingLimits(-1, -1); err != nil {
		t.Fatal(err)
	}
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}
	rig.publish = func(p []byte) error { return pub.Publish(natsBenchSubject("direct"), p) }
	rig.close = func() { close(done); s.Unsubscribe() }
	return rig
}

// natsBenchRoute returns the route of filter, last after routes-1 routes
// that select nothing the rigs publish (the scale figures' worst case for
// finding a message's route).
func natsBenchRoute(t *testing.T, filter string, routes int) (policy.Policy, []connectors.Route) {
	p := policy.NATSTokensV1()
	var rs []connectors.Route
	for i := range max(routes, 1) {
		f, name := filter, "bench"
		if i < routes-1 {
			f, name = fmt.Sprintf("scale%d.*.data", i), fmt.Sprintf("scale%d", i)
		}
		wf, err := p.ConvertFilter(f)
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, connectors.Route{Name: name, Foreign: f, Weida: wf})
	}
	return p, rs
}

// inboundRig: a nats.go publisher → nats-server → connectors.Bridge with
// the NATS Source (in this process) → the bridge's weida endpoint → a weida
// subscriber.
func inboundRig(t *testing.T, addr string, nroutes int) *benchRig {
	// A rig of its own subjects per route count, so that no other rig's
	// bridge on the same server receives this one's messages.
	prefix := "in"
	if nroutes > 1 {
		prefix = fmt.Sprintf("in%d", nroutes)
	}
	p, routes := natsBenchRoute(t, natsBenchFilter(prefix), nroutes)
	l, wpub, url := benchEndpoint(t)
	spec := connectors.Spec{Name: "bench-in", Protocol: policy.NATS, Direction: policy.Inbound, Policy: p, Routes: routes, Endpoint: url}
	host, port := brokertest.SplitAddr(t, addr)
	b := connectors.NewInbound(spec, func(report connectors.StateFunc) (connectors.Source, error) {
		return natsconn.NewSource(natsconn.Config{Host: host, Port: port, Name: "bench-in", LoopMarker: "bench"}, report)
	}, wpub, connectors.Deps{Metrics: connectors.NewMetrics(prometheus.NewRegistry())})
	stopBridge := runBridge(t, b)
	rig := &benchRig{name: "nats-server → bridge → weida", delivered: make(chan struct{}, benchWindow)}
	stopRecv := weidaReceiver(t, url, rig)
	waitSubscribers(t, wpub, 1, 10*time.Second)
	pub := natsConn(t, addr)
	rig.publish = func(p []byte) error { return pub.Publish(natsBenchSubject(prefix), p) }
	syncRig(t, rig, func() error { pub.Publish(natsBenchSubject(prefix), benchPayload); return pub.Flush() })
	rig.close = func() {
		stopRecv()
		closeBridgeRig(t, rig, b, stopBridge, l)
	}
	return rig
}

// outboundRig: a weida publisher → connectors.Bridge with the NATS Sink
// (dialling it, in this process) → nats-server → a nats.go subscriber.
// marker is the Sink's loop marker ("" writes no header).
func outboundRig(t *testing.T, addr string, blockingWrites bool, nroutes int, marker string) *benchRig {
	prefix := "bench"
	if blockingWrites {
		prefix = "benchw"
	}
	if nroutes > 1 {
		prefix += strconv.Itoa(nroutes)
	}
	if marker == "" {
		prefix += "n"
	}
	p, routes := natsBenchRoute(t, natsBenchFilter(prefix), nroutes)
	l, wpub, url := benchEndpoint(t)
	rig := &benchRig{name: "weida → bridge → nats-server", delivered: make(chan struct{}, benchWindow)}
	if blockingWrites {
		rig.name += " (Write)"
	}
	if marker == "" {
		rig.name += " (no loop marker)"
	}
	sub := natsConn(t, addr)
	done := make(chan struct{})
	s, err := sub.Subscribe(natsBenchFilter(prefix), func(m *natsgo.Msg) { rig.arrived(m.Data, done) })
	if err != nil {
		t.Fatal(err)
	}
	s.SetPendingLimits(-1, -1)
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}
	spec := connectors.Spec{Name: "bench-out", Protocol: policy.NATS, Direction: policy.Outbound, Policy: p, Routes: routes,
		Endpoint: url, InFlight: envInt(t, "WEIDA_BENCH_INFLIGHT", resourcesDefaultInFlight)}
	// As `connector run` does, the Sink marks every message with the
	// loop marker header, unless marker is empty (the out-nomarker rig,
	// which measures what the header costs).
	var sink *natsconn.Sink
	host, port := brokertest.SplitAddr(t, addr)
	b := connectors.NewOutbound(spec,
		func(ctx context.Context) (*weida.Subscriber, error) { return weida.Dial(ctx, url, weida.DialConfig{}) },
		func(report connectors.StateFunc) (connectors.Sink, error) {
			var err error
			sink, err = natsconn.NewSink(natsconn.Config{Host: host, Port: port, Name: "bench-out", LoopMarker: marker}, report)
			if blockingWrites {
				return struct{ connectors.Sink }{sink}, err // hides WriteAsync
			}
			return sink, err
		}, connectors.Deps{Metrics: connectors.NewMetrics(prometheus.NewRegistry())})
	stopBridge := runBridge(t, b)
	waitSubscribers(t, wpub, 1, 10*time.Second)
	syncRig(t, rig, func() error { return publishWeidaTopic(wpub, natsBenchSubject(prefix), benchPayload) })
	rig.publish = func(p []byte) error {
		if err := publishWeidaTopic(wpub, natsBenchSubject(prefix), p); err != nil {
			return fmt.Errorf("%w; listener %+v; bridge %+v", err, l.Stats(), b.Status())
		}
		return nil
	}
	rig.close = func() {
		close(done)
		if st := sink.Stats(); st.FlushRounds > 0 {
			t.Logf("%s: %d publishes confirmed by %d PING/PONG rounds (%.1f per round)",
				rig.name, st.Confirmed, st.FlushRounds, float64(st.Confirmed)/float64(st.FlushRounds))
		}
		closeBridgeRig(t, rig, b, stopBridge, l)
		s.Unsubscribe()
	}
	return rig
}

// TestNATSThroughput measures, in one run, 256-byte messages per second
// through nats-server alone, through weida alone, and through the bridge in
// each direction, and prints the ratio of each bridged rate to the smaller
// direct rate (the goal is 80 %). It runs only with WEIDA_BENCH=1;
// WEIDA_BENCH_MESSAGES and WEIDA_BENCH_ROUNDS change the sample size
// (default 100000) and the number of rounds (default 5); WEIDA_BENCH_RIGS
// (nats, weida, in, out, out-write, out-nomarker; comma-separated) runs only
// the rigs named, for profiling one path. Two rigs run only when named:
// out-write, the outbound bridge through the runtime's path for Sinks
// without WriteAsync, and out-nomarker, the outbound bridge writing no loop
// marker header.
func TestNATSThroughput(t *testing.T) {
	requireBench(t, "to run the throughput benchmark")
	// A private server: other tests' traffic on the shared one would
	// skew the numbers.
	srv := brokertest.StartNATS(t)
	throughput{broker: "nats-server", pid: srv.Pid(), rigs: []namedRig{
		{short: "nats", build: func() *benchRig { return natsDirectRig(t, srv.Addr()) }},
		{short: "weida", build: func() *benchRig { return weidaDirectRig(t) }},
		{short: "in", build: func() *benchRig { return inboundRig(t, srv.Addr(), 1) }},
		{short: "out", build: func() *benchRig { return outboundRig(t, srv.Addr(), false, 1, "bench") }},
		{short: "out-write", build: func() *benchRig { return outboundRig(t, srv.Addr(), true, 1, "bench") }, onRequest: true},
		{short: "out-nomarker", build: func() *benchRig { return outboundRig(t, srv.Addr(), false, 1, "") }, onRequest: true},
	}}.run(t, envInt(t, "WEIDA_BENCH_MESSAGES", 100000), envInt(t, "WEIDA_BENCH_ROUNDS", 5))
}
