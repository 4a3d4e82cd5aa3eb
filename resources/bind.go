package resources

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"weida.dev/connector/policy"
	"weida.dev/connector/weida/address"
	"weida.dev/connector/weida/topic"
)

// binder turns one structurally checked raw resource into a Connector:
// it applies the rules that span fields, applies defaults, binds the
// conversion policy, converts every route and checks the declared losses.
// It works on a resource that already has errors too, skipping each check
// whose inputs are wrong, so that one run reports as much as it can.
type binder struct {
	*decoder
	ld      *load
	raw     *rawResource
	relTo   func(string) string // resolves a path written in the file
	c       *Connector          // filled as far as the resource allows
	proto   Protocol            // the protocol spec.protocol names, when valid
	protoOK bool
	dirOK   bool
	optsOK  bool       // PolicyOptions reflect valid broker options
	hold    Hold       // whether the source can hold, from the protocol
	lastVal LastValues // whether the source knows its broker's last values, from the protocol
}

func (b *binder) ok(path string) bool {
	for _, e := range b.errs {
		if e.Field == path || strings.HasPrefix(e.Field, path+".") || strings.HasPrefix(e.Field, path+"[") {
			return false
		}
	}
	return true
}

// at returns where path is written, or its nearest written ancestor.
func (b *binder) at(path string) Position { return b.lookupPos(path, false) }

func (b *binder) bind() {
	raw := b.raw
	c := &Connector{Source: b.docPos()}
	b.c = c
	if raw.Metadata != nil {
		c.Name = raw.Metadata.Name
		c.Labels = raw.Metadata.Labels
	}
	s := raw.Spec
	if s == nil {
		return
	}
	if b.ok("spec.protocol") {
		b.proto = b.ld.protocols.byName(s.Protocol)
		c.Protocol, b.protoOK = policy.Protocol(s.Protocol), b.proto != nil
	}
	if b.ok("spec.direction") {
		c.Direction, b.dirOK = policy.Direction(s.Direction), s.Direction != ""
	}
	// Limits first: a protocol's defaults may depend on them.
	b.bindLimits(s.Limits)
	if s.Broker != nil {
		b.bindBroker(s.Broker)
	}
	if s.Weida != nil && b.dirOK {
		b.bindWeida(s.Weida)
	}
	if s.LastValue != nil {
		b.bindLastValue(s.LastValue)
	}
	if b.protoOK {
		b.bindPolicy(s)
	}
	b.bindDelivery(s.Delivery)
}

// bindDelivery applies spec.delivery: hold, and acknowledging once
// received, are for inbound sources whose broker keeps what the connector
// leaves unacknowledged.
func (b *binder) bindDelivery(rd *rawDelivery) {
	d := Delivery{WhenNoSubscriber: WhenNoSubscriberDrop, Acknowledge: AcknowledgeQueued}
	defer func() { b.c.Delivery = d }()
	const holdPath, ackPath = "spec.delivery.whenNoSubscriber", "spec.delivery.acknowledge"
	if rd == nil {
		return
	}
	setHold := rd.WhenNoSubscriber != "" && b.ok(holdPath)
	setAck := rd.Acknowledge != "" && b.ok(ackPath)
	if !setHold && !setAck {
		return
	}
	b.directionOnly("spec.delivery", true, "inbound", "it says what to do with a broker message no weida subscriber wants, and when one is acknowledged; an outbound resource reads from weida")
	if !b.dirOK || b.raw.Spec.Direction != "inbound" {
		return
	}
	if setHold && (rd.WhenNoSubscriber != WhenNoSubscriberHold || b.holds(holdPath, rd.WhenNoSubscriber, "delivery-hold", "hold")) {
		d.WhenNoSubscriber = rd.WhenNoSubscriber
	}
	if setAck && (rd.Acknowledge != AcknowledgeReceived || b.holds(ackPath, rd.Acknowledge, "delivery-received", "acknowledge: received")) {
		d.Acknowledge = rd.Acknowledge
	}
}

// holds reports whether the source keeps unacknowledged messages while
// the connector is away, which the choice at path needs; when it does
// not, it fails path under rule, naming why.
func (b *binder) holds(path, value, rule, choice string) bool {
	if !b.protoOK || !b.ok("spec.broker") || b.hold.OK {
		return true
	}
	why := b.hold.Why
	if why == "" {
		why = fmt.Sprintf("%s does not keep them", b.c.Protocol)
	}
	b.fail(path, b.at(path), value, rule, choice+" needs a source that keeps unacknowledged messages: "+why, b.hold.Hint)
	return false
}

// bindBroker fills c.Broker from the raw block. Its branches are one per
// field of spec.broker, each with its own refusal; kept together so that
// the block's rules read in the order the schema lists its fields.
func (b *binder) bindBroker(rb *rawBroker) {
	c, s := b.c, b.raw.Spec
	br := &c.Broker
	br.ClientID = rb.ClientID
	if br.ClientID == "" {
		br.ClientID = c.Name
	}
	if p := clientIDTemplateProblem(rb.ClientID); p != "" && b.ok("spec.broker.clientID") {
		b.fail("spec.broker.clientID", b.at("spec.broker.clientID"), rb.ClientID, "clientid-variable", p,
			"write ${NAME} for an environment variable, e.g. clientID: orders-${HOSTNAME}")
	}
	if b.protoOK && b.ok("spec.broker.url") && rb.URL != "" {
		u, _ := url.Parse(rb.URL) // brokerURLProblem accepted it
		rules := b.proto.URL()
		br.URL, br.Scheme, br.Host = rb.URL, u.Scheme, u.Hostname()
		br.TLS.Enabled = u.Scheme != rules.Scheme
		br.Port = rules.Port
		if br.TLS.Enabled {
			br.Port = rules.TLSPort
		}
		if p := u.Port(); p != "" {
			br.Port, _ = strconv.Atoi(p)
		}
		if rules.Path != "" {
			br.Path = strings.TrimPrefix(u.Path, "/")
		}
	}

	if rb.TLS != nil {
		path := "spec.broker.tls"
		if b.protoOK && b.ok("spec.broker.url") && br.URL != "" && !br.TLS.Enabled {
			b.fail(path, b.lookupPos(path, true), "", "tls-scheme",
				fmt.Sprintf("configures TLS, but the URL's scheme %s:// is plaintext", br.Scheme),
				fmt.Sprintf("write %s:// in spec.broker.url, or remove tls", b.proto.URL().TLSScheme))
		} else {
			br.TLS.CAFile = b.relTo(rb.TLS.CAFile)
			br.TLS.CertFile = b.relTo(rb.TLS.CertFile)
			br.TLS.KeyFile = b.relTo(rb.TLS.KeyFile)
			br.TLS.ServerName = rb.TLS.ServerName
		}
	}

	if rb.Credentials != nil {
		b.bindCredentials(rb.Credentials)
	}

	// Each protocol reads its own block. Only the block of the resource's
	// protocol may be present; the others are still decoded, so that what
	// is wrong inside them is reported too.
	bound := false
	for _, sec := range rb.Sections {
		p := b.ld.protocols.byName(sec.name)
		binding := b.protoOK && p == b.proto
		if b.protoOK && !binding {
			path := "spec.broker." + sec.name
			b.fail(path, b.lookupPos(path, true), "", "protocol-section",
				fmt.Sprintf("is a %s section, but spec.protocol is %s", sec.name, s.Protocol),
				fmt.Sprintf("remove it, or write spec.broker.%s for %s options", s.Protocol, s.Protocol))
		}
		opts := p.Broker(&BrokerBlock{b: b, name: sec.name, node: sec.node, present: true, binding: binding})
		if binding {
			b.setOptions(opts)
			bound = true
		}
	}
	if b.protoOK && !bound {
		b.setOptions(b.proto.Broker(&BrokerBlock{b: b, name: s.Protocol, binding: true}))
	}
}

func (b *binder) setOptions(o BrokerOptions) {
	b.c.Broker.Options = o.Options
	b.c.PolicyOptions = o.Policy
	b.optsOK = o.PolicyOK
	b.hold = o.Hold
	b.lastVal = o.LastValues
}

func (b *binder) directionOnly(path string, set bool, dir, why string) {
	if set && b.dirOK && b.raw.Spec.Direction != dir {
		b.fail(path, b.lookupPos(path, true), "", "direction-field",
			fmt.Sprintf("applies only to %s resources; this one is %s", dir, b.raw.Spec.Direction), why)
	}
}

func (b *binder) bindWeida(rw *rawWeida) {
	const base = "spec.weida"
	w := &b.c.Weida
	w.CertFile, w.KeyFile = b.relTo(rw.CertFile), b.relTo(rw.KeyFile)
	switch b.raw.Spec.Direction {
	case "inbound":
		b.directionOnly(base+".dial", rw.Dial != "", "outbound", "an inbound resource hosts its endpoint: write listen: weida://host:port/path")
		b.directionOnly(base+".caFile", rw.CAFile != "", "outbound", "an inbound endpoint admits clients by allowedClients: clientCAFile holds the CA of the clients it names by san or commonName")
		b.directionOnly(base+".failover", len(rw.Failover) > 0, "outbound", "an inbound resource hosts one address; its subscribers list the replicas' addresses")
		b.bindConnectionLimits(rw)
		if rw.Listen == "" {
			if rw.Dial == "" {
				b.fail(base+".listen", b.lookupPos(base+".listen", true), "", "required",
					"is required: an inbound resource hosts the weida endpoint its subscribers dial",
					"listen: weida://127.0.0.1:7001/sensors")
			}
			return
		}
		if !b.ok(base + ".listen") {
			return
		}
		a, _ := address.Parse(rw.Listen)
		if a.Fingerprint != "" {
			b.fail(base+".listen", b.at(base+".listen"), rw.Listen, "weida-listen-pin",
				"pins a fingerprint, but a listen address has none to pin: the endpoint presents its own certificate",
				"remove the sha256:...@ part; set certFile and keyFile, or leave them out to generate a certificate")
			return
		}
		w.Endpoint = a
		w.AllowedClients, w.Scopes = b.allowedClients(base+".allowedClients", rw.AllowedClients)
		b.bindClientCA(rw, w)
	case "outbound":
		b.directionOnly(base+".listen", rw.Listen != "", "inbound", "an outbound resource dials a publisher: write dial: weida://sha256:<fingerprint>@host:port/path")
		b.directionOnly(base+".maxConnections", rw.MaxConnections != nil, "inbound", "an outbound resource holds one connection to the endpoint it dials")
		b.directionOnly(base+".maxConnectionsPerAddress", rw.MaxConnectionsPerAddress != nil, "inbound", "an outbound resource holds one connection to the endpoint it dials")
		b.directionOnly(base+".idleTimeout", rw.IdleTimeout != nil, "inbound", "an outbound resource's connection keeps the idle timeout of the endpoint it dials")
		b.directionOnly(base+".allowedClients", len(rw.AllowedClients) > 0, "inbound", "an outbound resource is the client; it presents certFile/keyFile if the endpoint asks")
		b.directionOnly(base+".clientCAFile", rw.ClientCAFile != "", "inbound", "an outbound resource is the client; caFile holds the anchors for the endpoint it dials")
		if rw.Dial == "" {
			if rw.Listen == "" {
				b.fail(base+".dial", b.lookupPos(base+".dial", true), "", "required",
					"is required: an outbound resource dials the weida publisher endpoint it bridges from",
					"dial: weida://sha256:<fingerprint>@127.0.0.1:7001/orders")
			}
			return
		}
		if !b.ok(base + ".dial") {
			return
		}
		a, _ := address.Parse(rw.Dial)
		w.Endpoint = a
		w.CAFile = b.relTo(rw.CAFile)
		b.bindFailover(rw, a)
		switch {
		case a.Fingerprint == "" && rw.CAFile == "":
			b.fail(base+".dial", b.at(base+".dial"), rw.Dial, "weida-trust",
				"gives no way to verify the endpoint's certificate",
				"pin it in the URL, weida://sha256:<fingerprint>@host:port/path (the endpoint logs its fingerprint), or set caFile")
		case a.Fingerprint != "" && rw.CAFile != "":
			b.fail(base+".caFile", b.at(base+".caFile"), rw.CAFile, "weida-trust",
				"is set, but the URL pins a fingerprint, which takes precedence: caFile would be ignored",
				"remove caFile, or the sha256:...@ part of the URL")
		}
	}
}

// weidaMaxConnections is weida.DefaultMaxConnections, which resources does
// not import: the endpoint's limit when maxConnections is left out.
const weidaMaxConnections = 1024

// Bounds of spec.weida.idleTimeout. Below a second a subscriber whose
// process pauses for a collection or a busy moment is taken for gone; above
// a minute a vanished one holds its slot, and its queued copies wait to be
// counted, for longer than any reader would wait for news of it.
const (
	minIdleTimeout = time.Second
	maxIdleTimeout = time.Minute
)

// bindConnectionLimits binds spec.weida.maxConnections and
// maxConnectionsPerAddress, whose ranges the schema checked, and
// idleTimeout. A per-address limit above the endpoint's own would never
// apply, so it is refused rather than ignored.
func (b *binder) bindConnectionLimits(rw *rawWeida) {
	const base = "spec.weida"
	w := &b.c.Weida
	if rw.IdleTimeout != nil && b.ok(base+".idleTimeout") {
		path := base + ".idleTimeout"
		if v := time.Duration(*rw.IdleTimeout); v < minIdleTimeout || v > maxIdleTimeout {
			b.fail(path, b.at(path), v.String(), "weida-idle-timeout",
				"is outside 1s to 1m: shorter takes a subscriber that pauses for gone, longer keeps a vanished one for longer than anyone would wait",
				"write a duration between 1s and 1m, or leave it out for 2s")
		} else {
			w.IdleTimeout = v
		}
	}
	if rw.MaxConnections != nil && b.ok(base+".maxConnections") {
		w.MaxConnections = *rw.MaxConnections
	}
	if rw.MaxConnectionsPerAddress == nil || !b.ok(base+".maxConnectionsPerAddress") {
		return
	}
	w.MaxConnectionsPerAddress = *rw.MaxConnectionsPerAddress
	maxConns := weidaMaxConnections
	if w.MaxConnections != 0 {
		maxConns = w.MaxConnections
	}
	if w.MaxConnectionsPerAddress > maxConns {
		path := base + ".maxConnectionsPerAddress"
		b.fail(path, b.at(path), strconv.Itoa(w.MaxConnectionsPerAddress), "weida-connections",
			fmt.Sprintf("is above the endpoint's maxConnections (%d): it would never apply", maxConns),
			"lower maxConnectionsPerAddress, or raise maxConnections")
	}
}

// bindFailover binds spec.weida.failover, the further addresses of the
// endpoint dial names. Each must be another replica of that endpoint:
// the dialer keeps the path, filters and pin when it moves between them,
// so a different path or pin would be a different endpoint, and would
// bridge other topics or trust another certificate without a word.
func (b *binder) bindFailover(rw *rawWeida, first address.Address) {
	const field = "spec.weida.failover"
	if len(rw.Failover) == 0 || !b.ok(field) {
		return
	}
	addrs := []address.Address{first}
	raws := []string{rw.Dial}
	for _, raw := range rw.Failover {
		a, _ := address.Parse(raw)
		addrs = append(addrs, a)
		raws = append(raws, raw)
	}
	hints := map[string]string{
		"replica-path":      "write the path of dial, " + first.Path + ", or give this endpoint a resource of its own",
		"replica-pin":       "pin what dial pins (" + orNone(first.Fingerprint) + "): every replica of an endpoint presents the same certificate",
		"replica-duplicate": "remove the repeated address",
	}
	for _, e := range address.CheckReplicas(addrs, raws) {
		path := fmt.Sprintf("%s[%d]", field, e.Index-1)
		b.fail(path, b.at(path), e.Value, "weida-failover-"+strings.TrimPrefix(e.Rule, "replica-"), e.Msg, hints[e.Rule], e)
	}
	if !b.ok(field) {
		return
	}
	b.c.Weida.Failover = addrs[1:]
}

// orNone returns fp, or "no fingerprint" when it is empty.
func orNone(fp string) string {
	if fp == "" {
		return "no fingerprint"
	}
	return fp
}

func (b *binder) bindLimits(rl *rawLimits) {
	l := Limits{MaxMessageBytes: DefaultMaxMessageBytes, BufferBytes: DefaultBufferBytes, InFlight: DefaultInFlight}
	const base = "spec.limits"
	if rl != nil {
		if rl.MaxMessageBytes != nil && b.ok(base+".maxMessageBytes") {
			l.MaxMessageBytes = int64(*rl.MaxMessageBytes)
		}
		if rl.BufferBytes != nil && b.ok(base+".bufferBytes") {
			l.BufferBytes = int64(*rl.BufferBytes)
		}
		if rl.InFlight != nil && b.ok(base+".inFlight") {
			l.InFlight = *rl.InFlight
		}
		if l.BufferBytes < l.MaxMessageBytes && b.ok(base+".bufferBytes") && b.ok(base+".maxMessageBytes") {
			path, value := base+".bufferBytes", l.BufferBytes
			if rl.BufferBytes == nil {
				path, value = base+".maxMessageBytes", l.MaxMessageBytes
			}
			b.fail(path, b.lookupPos(path, true), strconv.FormatInt(value, 10), "limits-buffer",
				fmt.Sprintf("bufferBytes (%d) is smaller than maxMessageBytes (%d): a message of the largest allowed size could never be buffered", l.BufferBytes, l.MaxMessageBytes),
				"raise bufferBytes or lower maxMessageBytes")
		}
	}
	b.c.Limits = l
}

func (b *binder) bindPolicy(s *rawSpec) {
	const base = "spec.conversion"
	c := b.c
	var declared []string
	name := ""
	if s.Conversion != nil {
		name, declared = s.Conversion.Policy, s.Conversion.Losses
	}
	defaultPolicy := b.proto.Policies()[0]
	if name == "" {
		c.Policy = defaultPolicy
	} else {
		p, err := policy.Lookup(b.ld.protocols.policies(), name)
		if err != nil {
			var r *policy.Refusal
			hint := ""
			if errors.As(err, &r) {
				hint = r.Hint
			}
			b.fail(base+".policy", b.at(base+".policy"), name, "unknown-policy", "is not a conversion policy", hint, err)
			return
		}
		if p.Protocol() != c.Protocol {
			b.fail(base+".policy", b.at(base+".policy"), name, "policy-protocol",
				fmt.Sprintf("converts %s topics, but spec.protocol is %s", p.Protocol(), c.Protocol),
				fmt.Sprintf("use a %s policy (%s is the default), or leave policy out", c.Protocol, defaultPolicy.Name()))
			return
		}
		c.Policy = p
	}
	if s.Conversion != nil && s.Conversion.Mount != nil {
		if !b.bindMount(*s.Conversion.Mount) {
			return
		}
	}
	b.bindRoutes(s.Routes)
	if b.dirOK && b.optsOK {
		b.checkLosses(declared)
	}
}

// bindMount wraps the resource's policy in the mount the file names, so
// that every route and, at run time, every topic converts through it. It
// checks each prefix on its own first, so that a resource with two bad
// prefixes hears about both, each at its own field. It reports whether the
// mount is bound; without it the routes cannot be converted.
func (b *binder) bindMount(rm rawMount) bool {
	const base = "spec.conversion.mount"
	c := b.c
	m := policy.Mount{Foreign: rm.Foreign, Weida: rm.Weida}
	if m == (policy.Mount{}) {
		return true // two empty prefixes: no mount, as documented
	}
	ok := true
	for _, side := range []struct {
		field, value string
		m            policy.Mount
		hint         string
	}{
		{"foreign", m.Foreign, policy.Mount{Foreign: m.Foreign}, fmt.Sprintf("write a literal %s topic followed by its separator, e.g. %q", c.Protocol, exampleForeignPrefix(c.Policy.Grammar()))},
		{"weida", m.Weida, policy.Mount{Weida: m.Weida}, `write literal segments followed by '.', e.g. "plants.berlin."`},
	} {
		if side.value == "" {
			continue
		}
		_, err := policy.NewMounted(c.Policy, side.m)
		if err == nil {
			continue
		}
		path := base + "." + side.field
		var r *policy.Refusal
		if !errors.As(err, &r) {
			b.fail(path, b.at(path), side.value, "policy", fmt.Sprintf("cannot be mounted: %v", err), side.hint, err)
			ok = false
			continue
		}
		msg := fmt.Sprintf("is not a %s prefix %s can mount: %s", side.field, r.Policy, r.Reason)
		if r.Part != "" && r.Part != r.Input {
			msg = fmt.Sprintf("is not a %s prefix %s can mount (at %q): %s", side.field, r.Policy, r.Part, r.Reason)
		}
		hint := r.Hint
		if hint == "" {
			hint = side.hint
		}
		b.fail(path, b.at(path), side.value, r.Rule, msg, hint, err)
		ok = false
	}
	if !ok {
		return false
	}
	mp, err := policy.NewMounted(c.Policy, m)
	if err != nil { // each prefix is valid alone, and NewMounted checks no more
		b.fail(base, b.at(base), "", "policy", fmt.Sprintf("cannot be mounted: %v", err), "report this as a bug in the policy package", err)
		return false
	}
	c.Policy, c.Mount = mp, m
	return true
}

// exampleForeignPrefix is a foreign prefix in grammar g for hints: one
// literal level and g's separator ("factory/" for MQTT).
func exampleForeignPrefix(g policy.Grammar) string {
	return "factory" + string(g.Separator())
}

func (b *binder) bindRoutes(routes []rawRoute) {
	c := b.c
	names := map[string]int{}
	filters := map[string]int{}
	for i, r := range routes {
		path := fmt.Sprintf("spec.routes[%d]", i)
		if r.Filter == nil || !b.ok(path+".filter") {
			continue
		}
		fpath := path + ".filter"
		f := *r.Filter
		at := b.at(fpath)
		if j, dup := filters[f]; dup {
			b.fail(fpath, at, f, "route-duplicate", fmt.Sprintf("repeats the filter of spec.routes[%d]", j), "remove one of the two routes")
			continue
		}
		filters[f] = i
		w, err := c.Policy.ConvertFilter(f)
		if err != nil {
			var ref *policy.Refusal
			if errors.As(err, &ref) {
				msg := fmt.Sprintf("%s refuses this filter: %s", ref.Policy, ref.Reason)
				if ref.Part != "" && ref.Part != ref.Input {
					msg = fmt.Sprintf("%s refuses this filter at %q: %s", ref.Policy, ref.Part, ref.Reason)
				}
				b.fail(fpath, at, f, ref.Rule, msg, ref.Hint, err)
			} else {
				b.fail(fpath, at, f, "policy", fmt.Sprintf("%s cannot convert this filter: %v", c.Policy.Name(), err), "", err)
			}
			continue
		}
		if err := topic.ValidateFilter(w); err != nil { // a policy bug; never send it
			b.fail(fpath, at, f, policy.RuleWeidaInvalid, fmt.Sprintf("converts to %q, which weida refuses: %v", w, err), "report this as a bug in the policy", err)
			continue
		}
		name := r.Name
		if name == "" {
			name = f
		}
		if j, dup := names[name]; dup {
			npath := path + ".name"
			b.fail(npath, b.lookupPos(npath, true), name, "route-name-duplicate",
				fmt.Sprintf("is also the name of spec.routes[%d]", j), "give each route its own name")
			continue
		}
		names[name] = i
		c.Routes = append(c.Routes, Route{Name: name, Foreign: f, Weida: w, Source: at})
	}
}

// checkLosses compares the declared losses with what the policy computes
// for this direction and these options: each one missing and each one
// stated but not incurred is an error. A resource that states none gets
// one error listing them all, the line to paste, rather than one per loss.
func (b *binder) checkLosses(declared []string) {
	const base = "spec.conversion.losses"
	c := b.c
	want := c.Policy.Losses(c.Direction, c.PolicyOptions)
	c.Losses = slices.Clone(want)
	if !b.ok(base) {
		return
	}
	context := fmt.Sprintf("%s %s with %s", c.Protocol, c.Direction, c.Policy.Name())
	if c.Mount != (policy.Mount{}) {
		context += fmt.Sprintf(" mounting %q at %q", c.Mount.Foreign, c.Mount.Weida)
	}
	if o := b.proto.DescribeOptions(c.PolicyOptions); o != "" {
		context += ", " + o
	}
	stated := map[policy.Loss]bool{}
	for i, s := range declared {
		path := fmt.Sprintf("%s[%d]", base, i)
		l := policy.Loss(s)
		stated[l] = true
		switch {
		case !l.Valid():
			names := make([]string, 0, 20)
			for _, info := range policy.AllLosses() {
				names = append(names, string(info.Loss))
			}
			hint := "known losses: " + strings.Join(names, ", ")
			if s := closest(s, names); s != "" {
				hint = fmt.Sprintf("did you mean %s? (%s)", s, hint)
			}
			b.fail(path, b.at(path), s, "loss-unknown", "is not a loss this project names", hint)
		case !slices.Contains(want, l):
			b.fail(path, b.at(path), s, "loss-not-incurred",
				fmt.Sprintf("is stated, but this conversion (%s) does not lose %s", context, s),
				"remove it from spec.conversion.losses")
		}
	}
	if len(declared) == 0 && len(want) > 0 {
		list := joinLosses(want)
		b.fail(base, b.lookupPos(base, true), "", "loss-undeclared",
			fmt.Sprintf("states no losses, but this conversion (%s) loses %s", context, list),
			fmt.Sprintf("if the bridge may lose them, write in spec.conversion: losses: [%s] (docs/POLICIES.md says what each one means)", list))
		return
	}
	// Every missing loss in one error: one hint per loss would repeat
	// the same list of what to write once per loss.
	var missing []policy.Loss
	for _, l := range want {
		if !stated[l] {
			missing = append(missing, l)
		}
	}
	if len(missing) == 0 {
		return
	}
	why := make([]string, len(missing))
	for i, l := range missing {
		why[i] = fmt.Sprintf("%s (%s)", l, l.Description())
	}
	it := "it"
	if len(missing) > 1 {
		it = "them"
	}
	b.fail(base, b.lookupPos(base, true), joinLosses(missing), "loss-undeclared",
		fmt.Sprintf("this conversion (%s) loses %s, which spec.conversion.losses does not state: %s", context, joinLosses(missing), strings.Join(why, "; ")),
		fmt.Sprintf("if the bridge may lose %s, state every loss of this conversion: losses: [%s]", it, joinLosses(want)))
}

// fail with a cause.
func (b *binder) fail(path string, at Position, value, rule, msg, hint string, cause ...error) {
	b.decoder.fail(path, at, value, rule, msg, hint)
	if len(cause) > 0 && len(b.errs) > 0 {
		if e := b.errs[len(b.errs)-1]; e.Field == path && e.Rule == rule {
			e.Err = cause[0]
		}
	}
}

// isLoopback reports whether host is a loopback address or "localhost".
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func joinLosses(ls []policy.Loss) string {
	s := make([]string, len(ls))
	for i, l := range ls {
		s[i] = string(l)
	}
	return strings.Join(s, ", ")
}

// lastValueDuration checks an optional duration of spec.lastValue, which
// must be at least a millisecond (what a replay's age is counted in), and
// returns it, 0 when absent or refused.
func (b *binder) lastValueDuration(path string, d *Duration, what string) time.Duration {
	if d == nil || !b.ok(path) {
		return 0
	}
	if v := time.Duration(*d); v < time.Millisecond {
		b.fail(path, b.at(path), v.String(), "positive-duration",
			"is "+what+", and must be at least 1ms", "leave it out for no limit, or write a duration such as 30s or 24h")
		return 0
	}
	return time.Duration(*d)
}

// bindLastValue applies spec.lastValue. It runs after the broker block, so
// it knows whether a NATS resource uses JetStream, and before the losses
// are checked, which depend on it (the retain loss).
func (b *binder) bindLastValue(rl *rawLastValue) {
	const base = "spec.lastValue"
	c := b.c
	b.directionOnly(base, true, "inbound",
		"the cache replays to the weida subscribers of an endpoint the connector hosts; for an outbound MQTT resource see spec.broker.mqtt.retain")
	// A valid mode settles the losses even when a bound is wrong, so
	// that a bad bound is reported alone.
	if !b.ok(base+".mode") || !b.dirOK || c.Direction != policy.Inbound {
		return
	}
	lv := LastValue{Mode: rl.Mode, MaxTopics: DefaultLastValueTopics, MaxBytes: DefaultLastValueBytes}
	if rl.MaxTopics != nil && b.ok(base+".maxTopics") {
		lv.MaxTopics = *rl.MaxTopics
	}
	if rl.MaxBytes != nil && b.ok(base+".maxBytes") {
		lv.MaxBytes = int64(*rl.MaxBytes)
	}
	lv.MaxAge = b.lastValueDuration(base+".maxAge", rl.MaxAge,
		"how long after its source delivered it a cached value is still replayed")
	lv.OrphanAfter = b.lastValueDuration(base+".orphanAfter", rl.OrphanAfter,
		"how long the source may be disconnected before the cache is purged")
	if rl.WhenSourceDown == "withhold" {
		lv.WhenSourceDown = rl.WhenSourceDown
	}
	if rl.Persist != nil && *rl.Persist {
		if rl.Mode != "all" {
			b.fail(base+".persist", b.at(base+".persist"), "true", "last-value-persist",
				"keeps the cache on disk across restarts, which only mode all needs: in mode "+rl.Mode+" the broker keeps the values and gives them again at every start, and a copy on disk could contradict it",
				"remove persist, or write mode: all to cache and persist every message bridged")
		} else {
			lv.Persist = true
		}
	}
	if rl.Mode == "retained" && b.protoOK && b.optsOK && !b.lastVal.OK {
		why, hint := b.lastVal.Why, b.lastVal.Hint
		if why == "" {
			why = string(c.Protocol) + " keeps nothing"
		}
		if hint == "" {
			hint = "write mode: all to cache every message bridged"
		}
		b.fail(base+".mode", b.at(base+".mode"), rl.Mode, "last-value-retained",
			"caches what the broker keeps for late subscribers, and "+why, hint)
		// The losses are checked as the file means them, with the
		// cache, so that the refused mode is reported alone.
		c.PolicyOptions.LastValue = true
		return
	}
	c.LastValue = lv
	c.PolicyOptions.LastValue = true
}

// bindClientCA checks spec.weida.clientCAFile against the allowedClients
// just bound into w: the file and the entries naming CA-issued clients
// need each other, since either alone admits nobody it names.
func (b *binder) bindClientCA(rw *rawWeida, w *Weida) {
	const field = "spec.weida.clientCAFile"
	identities := 0
	for _, n := range w.AllowedClients {
		if !strings.HasPrefix(n, "sha256:") {
			identities++
		}
	}
	switch {
	case identities > 0 && rw.ClientCAFile == "":
		b.fail(field, b.lookupPos(field, true), "", "required",
			fmt.Sprintf("is required: allowedClients names %d client(s) by san or commonName, which only a certificate from a client CA can prove", identities),
			"clientCAFile: client-ca.pem (PEM CA certificates, relative to the resource file)")
	case identities == 0 && rw.ClientCAFile != "":
		b.fail(field, b.at(field), rw.ClientCAFile, "client-ca-unused",
			"admits nobody: no allowedClients entry names a client by san or commonName",
			"add entries such as {san: dns:dash-7.plant-a.example} for the clients this CA issues, or remove clientCAFile")
	default:
		w.ClientCAFile = b.relTo(rw.ClientCAFile)
	}
}
