package conntest

import (
	"context"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"weida.dev/connector/connectors"
	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// suiteBackoff is the runtime's wait between attempts in the suite: short,
// so that recoveries happen within a test's patience.
func suiteBackoff(n int) time.Duration {
	return connectors.Backoff{Initial: 50 * time.Millisecond, Max: 500 * time.Millisecond}.Wait(n)
}

// units is a runtime running one inbound and one outbound unit of a
// harness, as `connector run` runs resources, with the weida ends the
// test holds: a subscriber on the inbound unit's endpoint and the
// publisher the outbound unit dials.
type units struct {
	t       *testing.T
	h       Harness
	rt      *connectors.Runtime
	in, out string // unit names

	sub    *weida.Subscriber // on the inbound unit's endpoint
	pub    *weida.Publisher  // the outbound unit's weida source
	listen *weida.Listener   // pub's listener

	stopOnce sync.Once
}

// unitOptions changes how startUnits builds the units.
type unitOptions struct {
	// wrap, when set, wraps every Source the inbound unit's factory builds.
	wrap func(connectors.Source) connectors.Source
	// backoff replaces the suite's short backoff.
	backoff func(int) time.Duration
	// name is the inbound unit's name; empty means a unique one. A Source
	// built for the same name resumes the same broker-side state (session,
	// durable consumer, queue).
	name string
	// noOutbound runs only the inbound unit.
	noOutbound bool
}

// startUnits applies an inbound unit bridging filter and (unless
// o.noOutbound) an outbound unit publishing to it, both marked with the
// same loop marker, and dials the inbound endpoint. It does not wait for
// the units to be ready.
func startUnits(t *testing.T, h Harness, filter string, o unitOptions) *units {
	t.Helper()
	p := h.Policy()
	marker := "m-" + Unique()
	u := &units{t: t, h: h, in: o.name, out: "out-" + Unique()}
	if u.in == "" {
		u.in = "in-" + Unique()
	}
	bo := o.backoff
	if bo == nil {
		bo = suiteBackoff
	}
	u.rt = connectors.NewRuntime(connectors.Deps{
		Metrics: connectors.NewMetrics(prometheus.NewRegistry()),
		Backoff: bo,
		Drain:   time.Second,
	})
	t.Cleanup(u.stop)

	listen := "127.0.0.1:" + strconv.Itoa(brokertest.FreePort(t, "udp"))
	inName := u.in
	list := []connectors.Unit{{
		Spec: connectors.Spec{
			Name: inName, Protocol: p.Protocol(), Direction: policy.Inbound, Policy: p,
			Routes: []connectors.Route{route(t, p, filter)}, Endpoint: "weida://" + listen + "/conntest",
		},
		Listen: listen, Path: "/conntest",
		NewSource: func(report connectors.StateFunc) (connectors.Source, error) {
			src, err := h.NewSource(inName, marker, report)
			if err != nil || o.wrap == nil {
				return src, err
			}
			return o.wrap(src), nil
		},
	}}
	if !o.noOutbound {
		l, err := weida.Listen(context.Background(), "127.0.0.1:0", weida.ListenConfig{})
		if err != nil {
			t.Fatal(err)
		}
		u.listen = l
		t.Cleanup(func() { l.Close() })
		if u.pub, err = l.Publisher("/conntest-out"); err != nil {
			t.Fatal(err)
		}
		url := "weida://" + l.Fingerprint() + "@" + l.Addr().String() + "/conntest-out"
		outName := u.out
		list = append(list, connectors.Unit{
			Spec: connectors.Spec{
				Name: outName, Protocol: p.Protocol(), Direction: policy.Outbound, Policy: p,
				Routes: []connectors.Route{route(t, p, filter)}, Endpoint: url, InFlight: 8,
			},
			Dial: func(ctx context.Context) (*weida.Subscriber, error) { return weida.Dial(ctx, url, weida.DialConfig{}) },
			NewSink: func(report connectors.StateFunc) (connectors.Sink, error) {
				return h.NewSink(outName, marker, report)
			},
		})
	}
	if err := u.rt.Apply(ctxFor(t, 20*time.Second), list); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	sub, err := weida.Dial(ctxFor(t, 10*time.Second), "weida://"+listen+"/conntest", weida.DialConfig{InsecureSkipVerifyForTesting: true})
	if err != nil {
		t.Fatal(err)
	}
	u.sub = sub
	t.Cleanup(func() { sub.Close() })
	if err := sub.Subscribe(ctxFor(t, 10*time.Second), ""); err != nil {
		t.Fatal(err)
	}
	// SUBSCRIBE travels on its own stream: wait until the publisher of
	// the unit holds it, or a message could cross before it counts.
	u.waitFor("a weida subscriber on the inbound endpoint", 10*time.Second, func() bool {
		return u.status(u.in).Counters.Subscribers > 0
	})
	return u
}

// stop stops the runtime and closes the weida ends, once.
func (u *units) stop() {
	u.stopOnce.Do(func() {
		u.rt.Stop()
		if u.sub != nil {
			u.sub.Close()
		}
		if u.listen != nil {
			u.listen.Close()
		}
	})
}

// status returns the status of the unit named name.
func (u *units) status(name string) connectors.Status {
	for _, s := range u.rt.Statuses() {
		if s.Name == name {
			return s
		}
	}
	u.t.Fatalf("no unit %s in the runtime", name)
	return connectors.Status{}
}

// waitFor polls cond until it holds, failing the test after d.
func (u *units) waitFor(what string, d time.Duration, cond func() bool) {
	u.t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			u.t.Fatalf("%s: not within %v; statuses %+v", what, d, u.rt.Statuses())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitReady waits until every unit is Ready, and checks on the way that no
// failure is ever permanent: nothing a broker or network does is.
func (u *units) waitReady(d time.Duration) {
	u.t.Helper()
	u.waitFor("every unit Ready", d, func() bool {
		u.noPermanent()
		return u.rt.Ready()
	})
}

// noPermanent fails the test if a unit has failed for good.
func (u *units) noPermanent() {
	u.t.Helper()
	for _, s := range u.rt.Statuses() {
		if s.Failure != nil && s.Failure.Permanent {
			u.t.Fatalf("unit %s failed for good (%s: %s): nothing a broker or network does may be permanent",
				s.Name, s.Failure.Reason, s.Failure.Message)
		}
	}
}

// crossInbound publishes on the broker (through h) until a copy reaches
// the weida subscriber: right after a broker restart the unit may report
// itself up a moment before its subscription is back, and a message
// published before then is not the broker's to keep.
func (u *units) crossInbound(h Harness, topic, payload string, d time.Duration) {
	u.t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := h.Publish(ctx, &connectors.Message{Topic: topic, Payload: []byte(payload)})
		cancel()
		if err != nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		for {
			m, ok := receiveWeida(u.t, u.sub, 2*time.Second)
			if !ok {
				break
			}
			if string(m.Payload) == payload {
				return
			}
		}
	}
	u.t.Fatalf("inbound: %q never reached weida within %v; statuses %+v", payload, d, u.rt.Statuses())
}

// crossOutbound publishes on weida until a copy reaches a direct broker
// subscriber on filter (made anew through h).
func (u *units) crossOutbound(h Harness, filter, topic, payload string, d time.Duration) {
	u.t.Helper()
	msgs, stop, err := h.Subscribe(ctxFor(u.t, 10*time.Second), filter)
	if err != nil {
		u.t.Fatalf("direct subscribe: %v", err)
	}
	defer stop()
	w, err := h.Policy().TopicToWeida(topic)
	if err != nil {
		u.t.Fatal(err)
	}
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := u.pub.Publish(ctx, weida.Message{Topic: w, Payload: []byte(payload)})
		cancel()
		if err != nil {
			u.t.Fatalf("weida publish: %v", err)
		}
		for {
			m, ok := receiveBroker(msgs, 2*time.Second)
			if !ok {
				break
			}
			if string(m.Payload) == payload {
				return
			}
		}
	}
	u.t.Fatalf("outbound: %q never reached the broker within %v; statuses %+v", payload, d, u.rt.Statuses())
}

// blackhole returns the address of a listener that accepts connections and
// never answers, as a hung broker or a firewall that drops replies would.
// It and the connections it took are closed when the test ends.
func blackhole(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		l.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String()
}

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	return "127.0.0.1:" + strconv.Itoa(brokertest.FreePort(t, "tcp"))
}
