package resources_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
)

// Minimal valid resources, one per protocol and direction. Tests change
// them with string replacements, so each case shows only its mistake.
const (
	mqttIn = `apiVersion: connector.weida.dev/v1alpha1
kind: Connector
metadata:
  name: mqtt-in
spec:
  protocol: mqtt
  direction: inbound
  broker:
    url: mqtt://127.0.0.1:1883
    mqtt:
      qos: 1
  weida:
    listen: weida://127.0.0.1:7001/sensors
  conversion:
    losses: [delivery-best-effort, dotted-levels, expiry, ordering, properties, reply-to, retain, topic-length]
  routes:
    - filter: sensors/+/temperature
`
	mqttOut = `apiVersion: connector.weida.dev/v1alpha1
kind: Connector
metadata:
  name: mqtt-out
spec:
  protocol: mqtt
  direction: outbound
  broker:
    url: mqtt://127.0.0.1:1883
  weida:
    dial: weida://sha256:9091e5f37dc3e870fcce55bf2721bd5db9e7ba9067b3b8067fd12f0153a52b98@127.0.0.1:7002/orders
  conversion:
    losses: [delivery-best-effort, dollar-topics, empty-segments, forbidden-chars, ordering, slashed-segments, topic-length, wildcard-names]
  routes:
    - filter: orders/+/created
`
	natsIn = `apiVersion: connector.weida.dev/v1alpha1
kind: Connector
metadata:
  name: nats-in
spec:
  protocol: nats
  direction: inbound
  broker:
    url: nats://127.0.0.1:4222
  weida:
    listen: weida://127.0.0.1:7003/orders
  conversion:
    losses: [at-most-once, delivery-best-effort, non-utf8-names, ordering, properties, reply-to, topic-length]
  routes:
    - filter: orders.*.created
`
	natsOut = `apiVersion: connector.weida.dev/v1alpha1
kind: Connector
metadata:
  name: nats-out
spec:
  protocol: nats
  direction: outbound
  broker:
    url: nats://127.0.0.1:4222
  weida:
    dial: weida://127.0.0.1:7001/sensors
    caFile: ca.pem
  conversion:
    losses: [at-most-once, delivery-best-effort, empty-segments, forbidden-chars, ordering, wildcard-names]
  routes:
    - filter: sensors.*.temperature
`
	amqpIn = `apiVersion: connector.weida.dev/v1alpha1
kind: Connector
metadata:
  name: amqp-in
spec:
  protocol: amqp
  direction: inbound
  broker:
    url: amqp://127.0.0.1:5672/
    credentials:
      username: guest
      password: {env: AMQP_PASSWORD}
  weida:
    listen: weida://127.0.0.1:7004/audit
  conversion:
    losses: [delivery-best-effort, empty-routing-key, expiry, non-utf8-names, ordering, properties, reply-to]
  routes:
    - filter: audit.events.#
`
	amqpOut = `apiVersion: connector.weida.dev/v1alpha1
kind: Connector
metadata:
  name: amqp-out
spec:
  protocol: amqp
  direction: outbound
  broker:
    url: amqp://127.0.0.1:5672/
  weida:
    dial: weida://sha256:9091e5f37dc3e870fcce55bf2721bd5db9e7ba9067b3b8067fd12f0153a52b98@127.0.0.1:7001/sensors
  conversion:
    losses: [delivery-best-effort, empty-routing-key, ordering, topic-length]
  routes:
    - filter: factory.#
`
)

// edit applies replacements to base in order; each old string must occur.
func edit(t *testing.T, base string, pairs ...string) string {
	t.Helper()
	if len(pairs)%2 != 0 {
		t.Fatal("edit: odd number of strings")
	}
	for i := 0; i < len(pairs); i += 2 {
		if !strings.Contains(base, pairs[i]) {
			t.Fatalf("edit: %q not in the base resource", pairs[i])
		}
		base = strings.Replace(base, pairs[i], pairs[i+1], 1)
	}
	return base
}

// loadFiles loads the given files (name, content, name, content...) from a
// MapFS, in the order given.
func loadFiles(t *testing.T, files ...string) (*Set, error) {
	t.Helper()
	fsys := fstest.MapFS{}
	var names []string
	for i := 0; i+1 < len(files); i += 2 {
		fsys[files[i]] = &fstest.MapFile{Data: []byte(files[i+1])}
		names = append(names, files[i])
	}
	return Loader{FS: fsys}.Load(names...)
}

// diag is the part of a FieldError a test pins down.
type diag struct{ field, rule string }

func (d diag) String() string { return d.field + " " + d.rule }

func diags(errs []*FieldError) []diag {
	out := make([]diag, len(errs))
	for i, e := range errs {
		out[i] = diag{e.Field, e.Rule}
	}
	return out
}

// loadDiags loads doc as the only resource file and returns its
// diagnostics as "field rule", in the order the loader gave them.
func loadDiags(t *testing.T, doc string) []string {
	t.Helper()
	_, err := loadFiles(t, "a.yaml", doc)
	var got []string
	for _, d := range diags(Errors(err)) {
		got = append(got, d.String())
	}
	return got
}

func sortedDiags(ds []diag) []string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = d.String()
	}
	slices.Sort(s)
	return s
}

// checkWellFormed asserts what every error promises: a file, a line, a rule
// and a message, and the resource's name when the document has one.
func checkWellFormed(t *testing.T, set *Set) {
	t.Helper()
	for _, d := range set.Documents {
		for _, e := range slices.Concat(d.Errors, d.Warnings) {
			if e.File == "" || e.Rule == "" || e.Message == "" {
				t.Errorf("incomplete error: %#v", e)
			}
			if d.Source.Line > 0 && (e.Line < 1 || e.Column < 1) {
				t.Errorf("error without a line and column: %v", e)
			}
			if e.Resource != d.Name {
				t.Errorf("error names resource %q, document is %q: %v", e.Resource, d.Name, e)
			}
		}
		if (d.Connector == nil) != (len(d.Errors) > 0) {
			t.Errorf("document %s: Connector set = %v with %d errors", d.Source, d.Connector != nil, len(d.Errors))
		}
	}
}

func dump(set *Set) string {
	var b strings.Builder
	for _, d := range set.Documents {
		for _, e := range d.Errors {
			fmt.Fprintln(&b, e)
		}
	}
	return b.String()
}
