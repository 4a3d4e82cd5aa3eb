package connectors

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"weida.dev/connector/policy"
)

// TestIndexedRouteAgreesWithScan: with enough routes for the index, the
// route a message gets (inbound and outbound) is the one the scan of the
// routes in order gives, overlapping filters and the MQTT '$' rule
// included.
func TestIndexedRouteAgreesWithScan(t *testing.T) {
	cases := []struct {
		p       policy.Policy
		filters []string
		topics  []string
	}{
		{
			p:       policy.MQTTLevelsV1(),
			filters: []string{"a/+/c", "a/#", "+/b/c", "#", "$SYS/#", "x/y", "+/+", "a/b/+"},
			topics:  []string{"a/b/c", "a/x", "q/b/c", "zz", "$SYS/load", "$SYS", "x/y", "a/b/d", "a", "b/c/d/e"},
		},
		{
			p:       policy.NATSTail(),
			filters: []string{"a.*.c", "a.>", "*.b.c", "x.y", "*.*", "a.b.*"},
			topics:  []string{"a.b.c", "a.x", "q.b.c", "x.y", "a.b.d", "a", "b.c.d.e"},
		},
	}
	for _, c := range cases {
		t.Run(c.p.Name(), func(t *testing.T) {
			var routes []Route
			// Fillers that select none of the topics bring the count over
			// routeIndexMin; the interesting routes sit between them.
			for i := range routeIndexMin {
				f := fmt.Sprintf("filler%d", i)
				if c.p.Protocol() == policy.MQTT {
					f += "/+"
				} else {
					f += ".*"
				}
				routes = append(routes, mustRoute(t, c.p, f, fmt.Sprintf("f%d", i)))
				if i < len(c.filters) {
					routes = append(routes, mustRoute(t, c.p, c.filters[i], c.filters[i]))
				}
			}
			for _, dir := range []policy.Direction{policy.Inbound, policy.Outbound} {
				b := newBridge(Spec{Name: "r", Protocol: c.p.Protocol(), Direction: dir, Policy: c.p, Routes: routes}, Deps{Metrics: NewMetrics(prometheus.NewRegistry())})
				if b.routeIndex == nil {
					t.Fatalf("%d routes and no index", len(routes))
				}
				for _, ft := range c.topics {
					wt, err := c.p.TopicToWeida(ft)
					if err != nil {
						continue
					}
					if dir == policy.Inbound {
						want, wok := b.inboundRoute(ft)
						got, gok := b.indexedRoute(wt, ft)
						if got != want || gok != wok {
							t.Errorf("inbound %q: index gives %v %v, scan %v %v", ft, got.Name, gok, want.Name, wok)
						}
						continue
					}
					want, wr := b.outboundRoute(ft)
					got, gr := b.outboundRouteOf(wt, ft)
					if got != want || gr != wr {
						t.Errorf("outbound %q: index gives %v %q, scan %v %q", ft, got.Name, gr, want.Name, wr)
					}
				}
			}
		})
	}
}

func mustRoute(t *testing.T, p policy.Policy, filter, name string) Route {
	t.Helper()
	wf, err := p.ConvertFilter(filter)
	if err != nil {
		t.Fatalf("%s: %v", filter, err)
	}
	return Route{Name: name, Foreign: filter, Weida: wf}
}
