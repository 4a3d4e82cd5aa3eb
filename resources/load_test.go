package resources_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"weida.dev/connector/connectors/amqp"
	"weida.dev/connector/connectors/mqtt"
	"weida.dev/connector/connectors/nats"
	"weida.dev/connector/policy"
	"weida.dev/connector/resources"
)

func names(set *Set) []string {
	var out []string
	for _, d := range set.Documents {
		out = append(out, d.Name)
	}
	return out
}

func rename(t *testing.T, doc, from, to string) string {
	t.Helper()
	return edit(t, doc, "name: "+from, "name: "+to)
}

func TestLoadDirectories(t *testing.T) {
	fsys := fstest.MapFS{
		"conf/b.yaml":         {Data: []byte(mqttIn)},
		"conf/a.yml":          {Data: []byte(natsIn + "---\n" + amqpIn)},
		"conf/.hidden.yaml":   {Data: []byte("not: loaded")},
		"conf/notes.txt":      {Data: []byte("not yaml")},
		"conf/sub/deep.yaml":  {Data: []byte("not: loaded, directories are not recursive")},
		"conf/C.YAML":         {Data: []byte(amqpOut)},
		"other/x.yaml":        {Data: []byte(natsOut)},
		"empty/readme.md":     {Data: []byte("")},
		"blank/only-comments": {Data: []byte("")},
		"blank.yaml":          {Data: []byte("# nothing here\n---\n")},
	}
	set, err := Loader{FS: fsys}.Load("conf", "other/x.yaml", "conf/b.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// Sorted by name within the directory (upper case sorts first); the
	// file named again is read once.
	if got, want := names(set), []string{"amqp-out", "nats-in", "amqp-in", "mqtt-in", "nats-out"}; !slices.Equal(got, want) {
		t.Errorf("documents %q, want %q", got, want)
	}

	set, err = Loader{FS: fsys}.Load("missing.yaml", "empty", "blank.yaml")
	got := diags(Errors(err))
	want := []diag{{"", "path"}, {"", "no-resources"}, {"", "no-resources"}}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	for _, e := range Errors(err) {
		if e.Line != 0 || e.File == "" {
			t.Errorf("a path error names the path, without a line: %v", e)
		}
	}
	if len(set.Connectors()) != 0 {
		t.Error("connectors from nothing")
	}
}

func TestLoadMultiDocument(t *testing.T) {
	// An empty document between two others: goccy/go-yaml v1.19.2 alone
	// would drop the third document.
	stream := "# leading comment\n" + mqttIn + "---\n---\n# just a comment\n---\n" + natsIn + "...\n---\n" + rename(t, amqpIn, "amqp-in", "third")
	set, err := loadFiles(t, "multi.yaml", stream)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := names(set), []string{"mqtt-in", "nats-in", "third"}; !slices.Equal(got, want) {
		t.Fatalf("documents %q, want %q", got, want)
	}
	// Lines count from the start of the file.
	wantLines := []int{2, strings.Count(mqttIn, "\n") + 6, strings.Count(mqttIn+natsIn, "\n") + 8}
	for i, d := range set.Documents {
		if d.Source.Line != wantLines[i] {
			t.Errorf("document %d starts at line %d, want %d", i, d.Source.Line, wantLines[i])
		}
	}
}

func TestSyntaxErrorCostsOneDocument(t *testing.T) {
	bad := "apiVersion: [unclosed\n"
	set, err := loadFiles(t, "f.yaml", mqttIn+"---\n"+bad+"---\n"+natsIn)
	if len(set.Connectors()) != 2 {
		t.Errorf("%d valid connectors, want 2 around the broken document", len(set.Connectors()))
	}
	errs := Errors(err)
	if len(errs) != 1 || errs[0].Rule != "yaml-syntax" {
		t.Fatalf("errors: %v", err)
	}
	if want := strings.Count(mqttIn, "\n") + 2; errs[0].Line != want {
		t.Errorf("syntax error at line %d, want %d", errs[0].Line, want)
	}
}

// TestPositions pins line and column of errors, of document starts and of
// route sources.
func TestPositions(t *testing.T) {
	doc := edit(t, natsIn, "orders.*.created", "orders.>", "    url: nats://127.0.0.1:4222\n", "    url: nats://127.0.0.1:4222\n    clientId: x\n")
	set, err := loadFiles(t, "dir/p.yaml", doc)
	errs := Errors(err)
	if len(errs) != 2 {
		t.Fatalf("errors: %v", err)
	}
	// Sorted by position: the unknown key (line 10, column 5), then the
	// route's value (line 16, column 15).
	want := []Position{{"dir/p.yaml", 10, 5}, {"dir/p.yaml", 16, 15}}
	for i, e := range errs {
		if e.Position != want[i] {
			t.Errorf("error %d at %v, want %v (%v)", i, e.Position, want[i], e)
		}
	}
	if got := errs[1].Error(); !strings.HasPrefix(got, `dir/p.yaml:16:15: resource "nats-in": spec.routes[0].filter "orders.>": nats-tokens/v1 refuses`) {
		t.Errorf("Error() = %q", got)
	}
	var ref *policy.Refusal
	if !errors.As(err, &ref) || ref.Rule != policy.RuleNATSOneOrMore {
		t.Errorf("errors.As finds no refusal: %v", ref)
	}
	if set.Documents[0].Source != (Position{File: "dir/p.yaml", Line: 1}) {
		t.Errorf("source %v", set.Documents[0].Source)
	}

	set, _ = loadFiles(t, "r.yaml", mqttIn)
	c := set.Connectors()[0]
	if c.Routes[0].Source != (Position{"r.yaml", 17, 15}) {
		t.Errorf("route source %v", c.Routes[0].Source)
	}
	// A missing field points at its parent's key.
	_, err = loadFiles(t, "r.yaml", edit(t, mqttIn, "    url: mqtt://127.0.0.1:1883\n", ""))
	if e := Errors(err)[0]; e.Position != (Position{"r.yaml", 8, 3}) {
		t.Errorf("missing url reported at %v, want the broker key at 8:3", e.Position)
	}
}

// TestAllErrorsAtOnce: every error of every file, not the first.
func TestAllErrorsAtOnce(t *testing.T) {
	a := edit(t, mqttIn, "qos: 1", "qos: 2", "name: mqtt-in", "name: A", "retain, ", "", "sensors/+/temperature", "a/#/b")
	b := edit(t, natsIn, "orders.*.created", "orders.>", "direction: inbound", "direction: inbound\n  colour: blue")
	set, err := loadFiles(t, "a.yaml", a, "b.yaml", b)
	checkWellFormed(t, set)
	got := sortedDiags(diags(Errors(err)))
	want := sortedDiags([]diag{
		{"spec.broker.mqtt.qos", "mqtt-qos-2"}, {"metadata.name", "dnslabel"},
		{"spec.routes[0].filter", "mqtt-hash-not-final"},
		{"spec.colour", "unknown-field"}, {"spec.routes[0].filter", "nats-one-or-more"},
	})
	if !slices.Equal(got, want) {
		t.Errorf("got %q\nwant %q", got, want)
	}
	files := map[string]bool{}
	for _, e := range Errors(err) {
		files[e.File] = true
	}
	if len(files) != 2 {
		t.Errorf("errors from %d files, want 2", len(files))
	}
}

func TestDefaultsAndBinding(t *testing.T) {
	set, err := Loader{FS: fstest.MapFS{
		"cfg/in.yaml": {Data: []byte(mqttIn)},
		"cfg/amqp.yaml": {Data: []byte(edit(t, amqpIn, "  weida:\n    listen: weida://127.0.0.1:7004/audit\n",
			"  weida:\n    listen: weida://127.0.0.1:7004/audit\n    certFile: certs/c.pem\n    keyFile: /abs/k.pem\n"))},
		"cfg/nats.yaml": {Data: []byte(edit(t, natsOut, "    url: nats://127.0.0.1:4222\n",
			"    url: tls://127.0.0.1\n    tls: {caFile: ../ca.pem}\n    credentials: {creds: {file: user.creds}}\n"))},
	}}.Load("cfg")
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*Connector{}
	for _, c := range set.Connectors() {
		byName[c.Name] = c
	}

	m := byName["mqtt-in"]
	if m.Protocol != policy.MQTT || m.Direction != policy.Inbound || m.Policy.Name() != policy.MQTTLevels {
		t.Errorf("mqtt-in: %v %v %v", m.Protocol, m.Direction, m.Policy.Name())
	}
	if m.Broker.ClientID != "mqtt-in" || m.Broker.Host != "127.0.0.1" || m.Broker.Port != 1883 || m.Broker.TLS.Enabled {
		t.Errorf("broker %+v", m.Broker)
	}
	if m.Broker.Options != (mqtt.Options{QoS: 1, SessionExpiry: time.Hour}) {
		t.Errorf("mqtt options %+v", m.Broker.Options)
	}
	if m.Limits != (resources.Limits{MaxMessageBytes: 1 << 20, BufferBytes: 8 << 20, InFlight: 256}) {
		t.Errorf("limits %+v", m.Limits)
	}
	if m.PolicyOptions != (policy.Options{QoS: 1}) || !slices.Equal(m.Losses, m.Policy.Losses(policy.Inbound, m.PolicyOptions)) {
		t.Errorf("options %+v losses %v", m.PolicyOptions, m.Losses)
	}
	if m.Weida.Endpoint.String() != "weida://127.0.0.1:7001/sensors" || !m.Weida.Open() || !m.Weida.Generated() {
		t.Errorf("weida %+v", m.Weida)
	}
	if r := m.Routes[0]; r.Name != "sensors/+/temperature" || r.Foreign != "sensors/+/temperature" || r.Weida != "sensors.*.temperature" {
		t.Errorf("route %+v", r)
	}

	a := byName["amqp-in"]
	if a.Broker.Options != (amqp.Options{VHost: "/", Exchange: "amq.topic", Queue: amqp.Queue{Exclusive: true}, Prefetch: 256}) || a.Broker.Path != "" {
		t.Errorf("amqp options %+v path %q", a.Broker.Options, a.Broker.Path)
	}
	if a.Broker.Credentials.Username != "guest" || a.Broker.Credentials.Secret("password") != (SecretRef{Env: "AMQP_PASSWORD"}) {
		t.Errorf("credentials %+v", a.Broker.Credentials)
	}
	// Relative paths are relative to the file's directory.
	if a.Weida.CertFile != "cfg/certs/c.pem" || a.Weida.KeyFile != "/abs/k.pem" || a.Weida.Generated() {
		t.Errorf("certificate files %q %q", a.Weida.CertFile, a.Weida.KeyFile)
	}

	n := byName["nats-out"]
	if !n.Broker.TLS.Enabled || n.Broker.TLS.CAFile != "ca.pem" || n.Broker.Port != 4222 || n.Broker.Scheme != "tls" {
		t.Errorf("nats tls %+v port %d", n.Broker.TLS, n.Broker.Port)
	}
	if n.Broker.Credentials.Secret("creds") != (SecretRef{File: "cfg/user.creds"}) {
		t.Errorf("creds %+v", n.Broker.Credentials.Secret("creds"))
	}
	if n.Weida.CAFile != "cfg/ca.pem" || n.Weida.Endpoint.Fingerprint != "" {
		t.Errorf("dial trust %+v", n.Weida)
	}
	if n.Broker.Options != (nats.Options{}) || n.PolicyOptions.JetStream {
		t.Errorf("nats %+v", n.Broker.Options)
	}
}

func TestBindingOptions(t *testing.T) {
	tests := []struct {
		name  string
		doc   string
		check func(t *testing.T, c *Connector)
	}{
		{"mqtt options", edit(t, mqttIn, "      qos: 1\n", "      qos: 0\n      cleanStart: true\n      sessionExpiry: 0s\n      sharedGroup: replicas\n", "[delivery", "[at-most-once, delivery"),
			func(t *testing.T, c *Connector) {
				if c.Broker.Options != (mqtt.Options{QoS: 0, CleanStart: true, SharedGroup: "replicas"}) || c.PolicyOptions.QoS != 0 {
					t.Errorf("%+v", c.Broker.Options)
				}
			}},
		{"merge key", edit(t, mqttIn, "    mqtt:\n      qos: 1\n", "    mqtt:\n      <<: {qos: 0, cleanStart: true}\n      qos: 1\n"),
			func(t *testing.T, c *Connector) {
				if o, _ := mqtt.OptionsOf(c); o.QoS != 1 || !o.CleanStart {
					t.Errorf("merge: %+v", c.Broker.Options)
				}
			}},
		{"mqtts default port", edit(t, mqttIn, "mqtt://127.0.0.1:1883", "mqtts://[::1]"),
			func(t *testing.T, c *Connector) {
				if c.Broker.Port != 8883 || c.Broker.Host != "::1" || c.Broker.Addr() != "[::1]:8883" || !c.Broker.TLS.Enabled {
					t.Errorf("%+v", c.Broker)
				}
			}},
		{"amqps vhost", edit(t, amqpOut, "amqp://127.0.0.1:5672/", "amqps://broker.example/prod"),
			func(t *testing.T, c *Connector) {
				if o, _ := amqp.OptionsOf(c); c.Broker.Port != 5671 || o.VHost != "prod" || o.Queue != (amqp.Queue{}) || o.Prefetch != 0 {
					t.Errorf("%+v %+v", c.Broker, o)
				}
			}},
		{"amqp vhost with an escaped slash", edit(t, amqpOut, "amqp://127.0.0.1:5672/", "amqp://127.0.0.1:5672/team%2Fprod"),
			func(t *testing.T, c *Connector) {
				if o, _ := amqp.OptionsOf(c); o.VHost != "team/prod" || c.Broker.Path != "team/prod" {
					t.Errorf("vhost %q, want team/prod", o.VHost)
				}
			}},
		{"amqp queue and prefetch from inFlight", edit(t, amqpIn, "  weida:\n", "    amqp: {queue: {name: q, durable: true, exclusive: false}}\n  limits: {inFlight: 32}\n  weida:\n"),
			func(t *testing.T, c *Connector) {
				if c.Broker.Options != (amqp.Options{VHost: "/", Exchange: "amq.topic", Queue: amqp.Queue{Name: "q", Durable: true}, Prefetch: 32}) {
					t.Errorf("%+v", c.Broker.Options)
				}
			}},
		{"jetstream", edit(t, natsIn, "    url: nats://127.0.0.1:4222\n", "    url: nats://127.0.0.1:4222\n    nats: {jetstream: {stream: ORDERS, durable: bridge}}\n", "at-most-once, ", ""),
			func(t *testing.T, c *Connector) {
				if o, _ := nats.OptionsOf(c); *o.JetStream != (nats.JetStream{Stream: "ORDERS", Durable: "bridge"}) || !c.PolicyOptions.JetStream || slices.Contains(c.Losses, policy.LossAtMostOnce) {
					t.Errorf("%+v %+v %v", c.Broker.Options, c.PolicyOptions, c.Losses)
				}
			}},
		{"named routes", edit(t, amqpIn, "    - filter: audit.events.#\n", "    - {name: audit, filter: audit.events.#}\n    - filter: orders.*.new.#\n"),
			func(t *testing.T, c *Connector) {
				want := []Route{{"audit", "audit.events.#", "audit.events.#", Position{"r.yaml", 18, 29}}, {"orders.*.new.#", "orders.*.new.#", "orders.*.new.#", Position{"r.yaml", 19, 15}}}
				if !slices.Equal(c.Routes, want) {
					t.Errorf("routes %+v", c.Routes)
				}
			}},
		{"labels", edit(t, mqttIn, "  name: mqtt-in\n", "  name: mqtt-in\n  labels: {team: iot, app.kubernetes.io/part-of: demo}\n"),
			func(t *testing.T, c *Connector) {
				if len(c.Labels) != 2 || c.Labels["team"] != "iot" {
					t.Errorf("labels %v", c.Labels)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			set, err := loadFiles(t, "r.yaml", tt.doc)
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, set.Connectors()[0])
		})
	}
}

func TestEqualIgnoresPositions(t *testing.T) {
	s1, _ := loadFiles(t, "a.yaml", mqttIn)
	s2, _ := loadFiles(t, "b.yaml", "# moved down\n\n"+mqttIn)
	s3, _ := loadFiles(t, "c.yaml", edit(t, mqttIn, "qos: 1", "qos: 1\n      sessionExpiry: 2h"))
	a, b, c := s1.Connectors()[0], s2.Connectors()[0], s3.Connectors()[0]
	if !a.Equal(b) {
		t.Error("the same resource at another place is not Equal")
	}
	if a.Equal(c) {
		t.Error("a changed session expiry is Equal")
	}
	if a.Equal(nil) || !(*Connector)(nil).Equal(nil) {
		t.Error("nil handling")
	}
}

func TestWarnings(t *testing.T) {
	set, err := loadFiles(t, "r.yaml", edit(t, mqttIn, "127.0.0.1:7001", "0.0.0.0:7001"))
	if err != nil {
		t.Fatal(err)
	}
	d := set.Documents[0]
	if d.Connector == nil || len(d.Warnings) != 1 || d.Warnings[0].Rule != "open-endpoint" || d.Warnings[0].Field != "spec.weida.listen" {
		t.Fatalf("warnings %v", d.Warnings)
	}
	// Loopback, or a list of clients: no warning.
	for _, doc := range []string{mqttIn, edit(t, mqttIn, "127.0.0.1:7001/sensors", "10.0.0.1:7001/sensors\n    allowedClients: [sha256:"+strings.Repeat("ab", 32)+"]")} {
		set, _ := loadFiles(t, "r.yaml", doc)
		if w := set.Documents[0].Warnings; len(w) != 0 {
			t.Errorf("unexpected warnings %v", w)
		}
	}
}

// TestHostileInputBounded: inputs on which goccy/go-yaml's parser takes
// quadratic time are refused after the linear lexer, and a file of
// countless tiny documents stops at the document limit. (No timing
// assertion: a run that regresses is simply slow, by minutes.)
func TestHostileInputBounded(t *testing.T) {
	var keys strings.Builder
	for i := range maxMappingValues + 1 {
		keys.WriteString("k" + strings.Repeat("x", i%7) + ": v\n")
	}
	tests := []struct {
		name, doc, rule string
	}{
		{"many keys", keys.String(), "yaml-too-complex"},
		{"deep block sequences", strings.Repeat("- ", 50000) + "x", "yaml-too-complex"},
		{"deep flow", strings.Repeat("[", 50000), "yaml-too-complex"},
		{"mapping chain", strings.Repeat("a: ", 50000), "yaml-too-complex"},
		{"anchors", strings.Repeat("&a ", 50000), "yaml-too-complex"},
		{"many tokens", strings.Repeat("- [a, b]\n", maxTokens/4), "yaml-too-complex"},
		{"many documents", strings.Repeat("---\nx\n", maxDocuments+10), "file-too-many-documents"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadFiles(t, "x.yaml", tt.doc)
			errs := Errors(err)
			if !slices.ContainsFunc(errs, func(e *FieldError) bool { return e.Rule == tt.rule }) {
				t.Fatalf("no %s error among %d", tt.rule, len(errs))
			}
			if len(errs) > maxDocuments+1 {
				t.Errorf("%d errors", len(errs))
			}
		})
	}
	// A large legitimate resource stays within the bounds.
	var b strings.Builder
	b.WriteString(edit(t, mqttIn, "  routes:\n    - filter: sensors/+/temperature\n", "  routes:\n"))
	for i := range MaxRoutes {
		b.WriteString("    - name: r" + strings.Repeat("x", i%5) + string(rune('a'+i%26)) + "-" + itoa(i) + "\n      filter: s/+/" + itoa(i) + "\n")
	}
	if _, err := loadFiles(t, "big.yaml", b.String()); err != nil {
		t.Fatalf("256 routes: %v", err)
	}
}

func itoa(i int) string { return fmt.Sprint(i) }
