package connectors

import (
	"log/slog"

	"weida.dev/connector/policy"
	"weida.dev/connector/weida/topic"
)

// routeTable finds the route of a message, in either direction, and guards
// that the route selects it. It is immutable once built.
type routeTable struct {
	policy         policy.Policy
	routes         []Route
	routeByForeign map[string]Route // routes keyed by foreign filter
	// routeIndex, for a resource with routeIndexMin routes or more, holds
	// each route's position under its weida filter; nil: try each route.
	routeIndex *topic.Index[int]
}

func newRouteTable(p policy.Policy, routes []Route) routeTable {
	t := routeTable{policy: p, routes: routes, routeByForeign: make(map[string]Route, len(routes))}
	for _, r := range routes {
		t.routeByForeign[r.Foreign] = r
	}
	if len(routes) >= routeIndexMin {
		t.routeIndex = topic.NewIndex[int]()
		for i, r := range routes {
			if t.routeIndex.Insert(r.Weida, i) != nil {
				t.routeIndex = nil // not a weida filter: keep trying each route
				break
			}
		}
	}
	return t
}

// routeIndexMin is the number of routes from which a bridge finds a
// message's route through an index of the routes' weida filters rather than
// by trying each route in turn. A scan costs one match per route before
// the one that selects the topic (10,000 routes: hundreds of µs per
// message); the index walks only the trie nodes the topic can reach, and
// costs about as much as a dozen matches.
const routeIndexMin = 16

// indexedRoute returns the first route, in the resource's order, whose weida
// filter matches wt and whose foreign filter admits ft, where wt and ft are
// one topic in its weida and foreign forms. By the policies' exactness
// contract (see package policy) that is the first route whose foreign filter
// selects ft, which a scan would find; the guard checks it.
func (t *routeTable) indexedRoute(wt, ft string) (Route, bool) {
	best := -1
	t.routeIndex.Match(wt, func(i int) bool {
		if (best < 0 || i < best) && t.policy.Admit(t.routes[i].Foreign, ft) {
			best = i
		}
		return true
	})
	if best < 0 {
		return Route{}, false
	}
	return t.routes[best], true
}

// inboundRoute finds the first route whose foreign filter selects t.
func (t *routeTable) inboundRoute(ft string) (Route, bool) {
	g := t.policy.Grammar()
	for _, r := range t.routes {
		if g.Match(r.Foreign, ft) && t.policy.Admit(r.Foreign, ft) {
			return r, true
		}
	}
	return Route{}, false
}

// inboundRouteOf is inboundRoute for foreign topic ft, whose weida form
// is wt when converted is true: through the route index when the resource
// has one and the topic converted.
func (t *routeTable) inboundRouteOf(wt, ft string, converted bool) (Route, bool) {
	if t.routeIndex != nil && converted {
		return t.indexedRoute(wt, ft)
	}
	return t.inboundRoute(ft)
}

// outboundRouteOf is outboundRoute for foreign topic ft, converted from
// weida topic wt: through the route index when the resource has one. A
// topic the index places under no route goes through the scan, which names
// the reason.
func (t *routeTable) outboundRouteOf(wt, ft string) (Route, string) {
	if t.routeIndex != nil {
		if r, ok := t.indexedRoute(wt, ft); ok {
			return r, ""
		}
	}
	return t.outboundRoute(ft)
}

// outboundRoute finds the first route that may produce foreign topic t, or
// the reason none may. A topic kept from a route only by the foreign
// protocol's own exclusion (MQTT: '$' topics under a leading wildcard) is
// counted apart, under the policy's AdmitRule.
func (t *routeTable) outboundRoute(ft string) (Route, string) {
	g := t.policy.Grammar()
	excluded := false
	for _, r := range t.routes {
		if !t.policy.Admit(r.Foreign, ft) {
			excluded = true
			continue
		}
		if g.Match(r.Foreign, ft) {
			return r, ""
		}
	}
	if rule := t.policy.AdmitRule(); excluded && rule != "" {
		return Route{}, rule
	}
	return Route{}, ReasonNoRoute
}

// exact reports whether route r selects both forms of one topic: the
// foreign topic ft by the grammar's own matcher (and the protocol's own
// exclusions) and the weida topic wt by weida's.
func (t *routeTable) exact(r Route, ft, wt string) bool {
	return t.policy.Grammar().Match(r.Foreign, ft) && t.policy.Admit(r.Foreign, ft) && topic.Match(r.Weida, wt)
}

// guard is the exactness guard, the last check before a message crosses:
// the route that was selected for it, by the index or by the scan, must
// select both of its forms (see exact). It re-checks what selected the
// route with other code, so that a defect in a policy's conversion or in
// the route index drops a message instead of delivering it where no route
// says. A miss is counted as guard-mismatch and logged, rate-limited.
func (b *core) guard(r Route, ft, wt string) bool {
	if b.exact(r, ft, wt) {
		return true
	}
	b.drop(r.Name, ReasonGuardMismatch, slog.LevelError, "DEFECT: the converted topic escapes the route that selected it; dropped",
		slog.String("topic", ft), slog.String("weida_topic", wt), slog.String("filter", r.Foreign), slog.String("weida_filter", r.Weida))
	return false
}
