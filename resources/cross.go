package resources

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	"weida.dev/connector/policy"
	"weida.dev/connector/weida/address"
)

// crossCheck applies the rules that span resources. Each resource in a
// conflict gets its own error naming the others, so that the output for any
// one resource is complete. It uses what binding could fill in even for
// resources with other errors.
func crossCheck(set *Set, ps protocolList) {
	var docs []*Document
	for _, d := range set.Documents {
		if d.partial != nil {
			docs = append(docs, d)
		}
	}
	uniqueNames(docs)
	listenConflicts(docs)
	mountConflicts(docs)
	// What one broker identity is (an MQTT client id, a JetStream durable,
	// an AMQP queue) is each protocol's to say.
	for _, p := range ps {
		var mine []*Document
		for _, d := range docs {
			if d.partial.Protocol == p.Name() {
				mine = append(mine, d)
			}
		}
		if len(mine) > 1 {
			p.CheckSet(&SetCheck{docs: mine})
		}
	}
}

// conflict adds to each member of group an error naming the other members.
func conflict(group []*Document, field func(*Document) string, value func(*Document) string, rule string, msg func(others string) string, hint string) {
	const named = 3 // name this many others, count the rest: a group can be large
	for _, d := range group {
		var others []string
		for _, o := range group {
			if o == d {
				continue
			}
			if len(others) == named {
				others = append(others, fmt.Sprintf("%d more", len(group)-1-named))
				break
			}
			others = append(others, fmt.Sprintf("%s (%s)", orUnnamed(o.Name), o.Source))
		}
		path := field(d)
		d.Errors = append(d.Errors, &FieldError{
			Position: d.pos(path), Field: path, Value: value(d), Rule: rule,
			Message: msg(strings.Join(others, ", ")), Hint: hint,
		})
	}
}

func orUnnamed(name string) string {
	if name == "" {
		return "an unnamed resource"
	}
	return "resource " + name
}

// groupBy returns the groups of two or more documents sharing a key, in
// the order their first member appears. Documents whose key is "" are left
// out.
func groupBy(docs []*Document, key func(*Document) string) [][]*Document {
	idx := map[string]int{}
	var groups [][]*Document
	for _, d := range docs {
		k := key(d)
		if k == "" {
			continue
		}
		i, ok := idx[k]
		if !ok {
			i = len(groups)
			idx[k] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], d)
	}
	return slices.DeleteFunc(groups, func(g []*Document) bool { return len(g) < 2 })
}

// groupByAny returns the groups of two or more documents linked by a
// shared key, directly or through others (the connected components of
// the relation "has a key in common"), in the order their first member
// appears, each member in document order.
func groupByAny(docs []*Document, keys func(*Document) []string) [][]*Document {
	parent := make([]int, len(docs))
	for i := range parent {
		parent[i] = i
	}
	root := func(i int) int {
		for parent[i] != i {
			parent[i] = parent[parent[i]]
			i = parent[i]
		}
		return i
	}
	owner := map[string]int{}
	for i, d := range docs {
		for _, k := range keys(d) {
			if j, ok := owner[k]; ok {
				if a, b := root(i), root(j); a != b {
					parent[max(a, b)] = min(a, b) // the earlier document roots the group
				}
			} else {
				owner[k] = i
			}
		}
	}
	idx := map[int]int{}
	var groups [][]*Document
	for i, d := range docs {
		r := root(i)
		gi, ok := idx[r]
		if !ok {
			gi = len(groups)
			idx[r] = gi
			groups = append(groups, nil)
		}
		groups[gi] = append(groups[gi], d)
	}
	return slices.DeleteFunc(groups, func(g []*Document) bool { return len(g) < 2 })
}

// endpointKeys returns, for an outbound resource, the canonical host:port
// and path of each address it may dial (dial, then failover); nil for any
// other resource.
func endpointKeys(d *Document) []string {
	c := d.partial
	if c.Direction != policy.Outbound || c.Weida.Endpoint.Port == 0 {
		return nil
	}
	keys := []string{c.Weida.Endpoint.CanonicalHostPort() + c.Weida.Endpoint.Path}
	for _, a := range c.Weida.Failover {
		keys = append(keys, a.CanonicalHostPort()+a.Path)
	}
	return keys
}

func fixed(s string) func(*Document) string { return func(*Document) string { return s } }

func uniqueNames(docs []*Document) {
	for _, g := range groupBy(docs, func(d *Document) string { return d.Name }) {
		conflict(g, fixed("metadata.name"), func(d *Document) string { return d.Name }, "name-duplicate",
			func(others string) string { return "is also the name of " + others },
			"give every resource its own metadata.name")
	}
}

// canonicalHost makes equal hosts compare equal: IP addresses in their
// standard form, names in lower case.
func canonicalHost(h string) string { return address.CanonicalHost(h) }

func isWildcardHost(h string) bool {
	ip := net.ParseIP(h)
	return ip != nil && ip.IsUnspecified()
}

func inbound(d *Document) bool {
	return d.partial.Direction == policy.Inbound && d.partial.Weida.Endpoint.Port != 0
}

func listenAddr(d *Document) string {
	if !inbound(d) {
		return ""
	}
	e := d.partial.Weida.Endpoint
	return net.JoinHostPort(canonicalHost(e.Host), strconv.Itoa(e.Port))
}

// listenConflicts reports resources that would share an endpoint or a
// listener while disagreeing on what the listener owns. It stays one
// function of one check per listener property, in the order an operator
// reads a resource's weida block: splitting it would scatter that list.
func listenConflicts(docs []*Document) {
	const listen = "spec.weida.listen"
	endpoint := func(d *Document) string { return d.partial.Weida.Endpoint.String() }

	// One endpoint (address and path) can publish for one resource only.
	for _, g := range groupBy(docs, func(d *Document) string {
		if a := listenAddr(d); a != "" {
			return a + d.partial.Weida.Endpoint.Path
		}
		return ""
	}) {
		conflict(g, fixed(listen), endpoint, "weida-endpoint-duplicate",
			func(others string) string {
				return "is also the endpoint of " + others + ": subscribers could not tell whose messages they get"
			},
			"give each inbound resource its own path (resources may share the address)")
	}

	// Resources sharing a listen address share one listener, so they must
	// agree on what belongs to the listener: its certificate, the clients
	// it admits, and the per-subscriber buffer.
	for _, g := range groupBy(docs, listenAddr) {
		if !allSame(g, func(d *Document) string { return d.partial.Weida.CertFile + "\x00" + d.partial.Weida.KeyFile }) {
			conflict(g, func(d *Document) string {
				if d.partial.Weida.CertFile == "" {
					return listen
				}
				return "spec.weida.certFile"
			}, func(d *Document) string {
				if d.partial.Weida.CertFile == "" {
					return "generated"
				}
				return d.partial.Weida.CertFile
			}, "weida-listen-certificate",
				func(others string) string {
					return "gives this listen address another certificate than " + others + "; one address presents one certificate"
				},
				"use the same certFile and keyFile (or leave both out, to share one generated certificate) in every resource on this address")
		}
		if !allSame(g, func(d *Document) string {
			fps := slices.Clone(d.partial.Weida.AllowedClients)
			slices.Sort(fps)
			// The CA proves the identities listed: another CA admits others.
			return strings.Join(fps, ",") + "\x00" + d.partial.Weida.ClientCAFile
		}) {
			conflict(g, func(d *Document) string {
				if len(d.partial.Weida.AllowedClients) == 0 {
					return listen
				}
				return "spec.weida.allowedClients"
			}, func(d *Document) string {
				if len(d.partial.Weida.AllowedClients) == 0 {
					return "anyone"
				}
				if ca := d.partial.Weida.ClientCAFile; ca != "" {
					return fmt.Sprintf("%d clients, client CA %s", len(d.partial.Weida.AllowedClients), ca)
				}
				return fmt.Sprintf("%d fingerprints", len(d.partial.Weida.AllowedClients))
			}, "weida-listen-clients",
				func(others string) string {
					return "admits other clients than " + others + " on the same listen address; a listener admits clients for all its paths, so a client admitted for one path could read the others"
				},
				"give every resource on this address the same allowedClients, or put them on different ports")
		}
		connLimits := func(d *Document) string {
			return fmt.Sprintf("maxConnections %d, maxConnectionsPerAddress %d", d.partial.Weida.MaxConnections, d.partial.Weida.MaxConnectionsPerAddress)
		}
		if !allSame(g, connLimits) {
			conflict(g, fixed("spec.weida.maxConnections"), connLimits, "weida-listen-limits",
				func(others string) string {
					return "differs from " + others + " on the same listen address; weida counts connections per listener (0 is the default)"
				},
				"use the same maxConnections and maxConnectionsPerAddress in every resource on this address")
		}
		idle := func(d *Document) string {
			if d.partial.Weida.IdleTimeout == 0 {
				return "idleTimeout 2s (the default)"
			}
			return "idleTimeout " + d.partial.Weida.IdleTimeout.String()
		}
		if !allSame(g, idle) {
			conflict(g, fixed("spec.weida.idleTimeout"), idle, "weida-listen-limits",
				func(others string) string {
					return "differs from " + others + " on the same listen address; weida runs one idle timeout per listener"
				},
				"use the same idleTimeout in every resource on this address")
		}
		if !allSame(g, func(d *Document) string { return strconv.FormatInt(d.partial.Limits.BufferBytes, 10) }) {
			conflict(g, fixed("spec.limits.bufferBytes"), func(d *Document) string { return strconv.FormatInt(d.partial.Limits.BufferBytes, 10) },
				"weida-listen-limits",
				func(others string) string {
					return "differs from " + others + " on the same listen address; weida bounds each subscriber's buffer per listener"
				},
				"use the same limits.bufferBytes in every resource on this address")
		}
	}

	// A wildcard address (0.0.0.0, ::) and a specific one on the same port
	// cannot both be bound.
	byPort := groupBy(docs, func(d *Document) string {
		if !inbound(d) {
			return ""
		}
		return strconv.Itoa(d.partial.Weida.Endpoint.Port)
	})
	for _, g := range byPort {
		if allSame(g, listenAddr) {
			continue // one address: checked above
		}
		hasWildcard := slices.ContainsFunc(g, func(d *Document) bool { return isWildcardHost(d.partial.Weida.Endpoint.Host) })
		if !hasWildcard {
			continue
		}
		conflict(g, fixed(listen), endpoint, "weida-listen-overlap",
			func(others string) string {
				return "uses the same port as " + others + ", and one of them listens on every address, so the second listener cannot bind"
			},
			"listen on the same address in every resource on this port, or use different ports")
	}
}

func allSame(g []*Document, f func(*Document) string) bool {
	for _, d := range g[1:] {
		if f(d) != f(g[0]) {
			return false
		}
	}
	return true
}

// mountConflicts refuses mounts that overlap on one dialled weida
// endpoint. A resource whose mount has a weida prefix claims that subtree
// of the endpoint (the prefix's parent and everything below it): the
// mapping between its broker's subtree and the claimed one is a bijection
// only if no other resource on the endpoint also bridges topics of it. So
// two claims overlap when one prefix starts with the other (plants. and
// plants.berlin.; plants.b. and plants.berlin. are disjoint because
// prefixes end at a segment boundary), and a resource without a weida
// prefix overlaps a claim when one of its routes' weida filters can select
// a topic inside it. Two resources without weida prefixes claim nothing
// and are not checked here.
//
// Inbound resources are not checked: a listen address and path publish
// for one resource only (weida-endpoint-duplicate), so their mounts cannot
// share an endpoint.
//
// Resources are on one endpoint when they share an address of it, dial or
// failover: a Failover may reach any of them, so a resource dialling A with
// failover B and another dialling B with failover A both end up on B once
// A is down. The relation is closed transitively for the same reason.
func mountConflicts(docs []*Document) {
	const rule = "mount-overlap"
	groups := groupByAny(docs, endpointKeys)
	for _, g := range groups {
		if !slices.ContainsFunc(g, func(d *Document) bool { return d.partial.Mount.Weida != "" }) {
			continue
		}
		for _, d := range g {
			var others []string
			field, value := "", ""
			for _, o := range g {
				if o == d {
					continue
				}
				f, v, ok := mountOverlap(d, o)
				if !ok {
					continue
				}
				if field == "" {
					field, value = f, v
				}
				others = append(others, fmt.Sprintf("%s (%s)", orUnnamed(o.Name), o.Source))
			}
			if len(others) == 0 {
				continue
			}
			const named = 3
			if len(others) > named {
				others = append(others[:named], fmt.Sprintf("%d more", len(others)-named))
			}
			msg := "claims weida topics on the same endpoint as " + strings.Join(others, ", ") +
				": a topic both select would be bridged twice, so the mount would not be a one-to-one mapping"
			hint := "give each resource on this endpoint its own weida prefix, none starting with another (plants.berlin. and plants.paris., not plants. and plants.berlin.)"
			if d.partial.Mount.Weida == "" {
				msg = "selects weida topics that a mounted resource on the same endpoint claims, " + strings.Join(others, ", ") +
					": a topic both select would be bridged twice, so the mount would not be a one-to-one mapping"
				hint = "narrow this filter so that it selects nothing inside the other resource's weida prefix, or mount this resource under a prefix of its own"
			}
			d.Errors = append(d.Errors, &FieldError{
				Position: d.pos(field), Field: field, Value: value, Rule: rule, Message: msg, Hint: hint,
			})
		}
	}
}

// mountOverlap reports whether d and o, on one endpoint, may both bridge a
// weida topic while at least one of them claims a subtree by its mount,
// and names the field of d to blame: its weida prefix, or its first route
// reaching into o's subtree.
func mountOverlap(d, o *Document) (field, value string, ok bool) {
	dw, ow := d.partial.Mount.Weida, o.partial.Mount.Weida
	switch {
	case dw != "" && ow != "":
		if strings.HasPrefix(dw, ow) || strings.HasPrefix(ow, dw) {
			return "spec.conversion.mount.weida", dw, true
		}
	case dw != "":
		for _, r := range o.partial.Routes {
			if filterReaches(r.Weida, dw) {
				return "spec.conversion.mount.weida", dw, true
			}
		}
	case ow != "":
		for i, r := range d.partial.Routes {
			if filterReaches(r.Weida, ow) {
				return fmt.Sprintf("spec.routes[%d].filter", routeIndex(d, i)), r.Foreign, true
			}
		}
	}
	return "", "", false
}

// routeIndex returns the index in the file of d's i-th bound route, which
// differs from i when routes before it failed to bind.
func routeIndex(d *Document, i int) int {
	want := d.partial.Routes[i].Source
	for j := i; j < MaxRoutes; j++ {
		if d.pos(fmt.Sprintf("spec.routes[%d].filter", j)) == want {
			return j
		}
	}
	return i
}

// filterReaches reports whether the weida filter f selects at least one
// topic inside the subtree of the weida prefix w (its parent, w without
// the final '.', and every topic starting with w).
func filterReaches(f, w string) bool {
	if f == "" {
		return true // the empty filter selects everything
	}
	fs := strings.Split(f, ".")
	for i, seg := range strings.Split(w[:len(w)-1], ".") {
		if i == len(fs) {
			return false // every topic f selects is shorter than the parent
		}
		switch fs[i] {
		case "#":
			return true
		case "*", seg:
		default:
			return false
		}
	}
	// f's first segments select the parent; whatever follows selects the
	// parent itself or topics below it.
	return true
}
