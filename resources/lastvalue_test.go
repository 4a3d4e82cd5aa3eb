package resources_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"weida.dev/connector/policy"
	"weida.dev/connector/resources"
)

func TestLastValue(t *testing.T) {
	const noRetain = "losses: [delivery-best-effort, dotted-levels, expiry, ordering, properties, reply-to, topic-length]"
	const withRetain = "losses: [delivery-best-effort, dotted-levels, expiry, ordering, properties, reply-to, retain, topic-length]"
	lastValue := "  lastValue:\n    mode: retained\n    maxTopics: 5\n    maxBytes: 1MiB\n  routes:"

	t.Run("mqtt-retained", func(t *testing.T) {
		doc := edit(t, mqttIn, withRetain, noRetain, "  routes:", lastValue)
		set, err := loadFiles(t, "a.yaml", doc)
		if err != nil {
			t.Fatal(err)
		}
		c := set.Connectors()[0]
		if want := (resources.LastValue{Mode: "retained", MaxTopics: 5, MaxBytes: 1 << 20}); c.LastValue != want {
			t.Errorf("LastValue = %+v, want %+v", c.LastValue, want)
		}
		if !c.PolicyOptions.LastValue || slices.Contains(c.Losses, policy.LossRetain) {
			t.Errorf("options %+v, losses %v: the cache replays retained values, so retain is not lost", c.PolicyOptions, c.Losses)
		}
	})
	t.Run("mqtt-defaults", func(t *testing.T) {
		doc := edit(t, mqttIn, withRetain, noRetain, "  routes:", "  lastValue:\n    mode: all\n  routes:")
		set, err := loadFiles(t, "a.yaml", doc)
		if err != nil {
			t.Fatal(err)
		}
		want := resources.LastValue{Mode: "all", MaxTopics: resources.DefaultLastValueTopics, MaxBytes: resources.DefaultLastValueBytes}
		if c := set.Connectors()[0]; c.LastValue != want {
			t.Errorf("LastValue = %+v, want %+v", c.LastValue, want)
		}
	})
	for _, c := range []struct {
		name, doc string
		want      []string
	}{
		// The declared-losses check holds both ways.
		{"retain-stated-but-replayed", edit(t, mqttIn, "  routes:", lastValue), []string{"spec.conversion.losses[6] loss-not-incurred"}},
		{"retain-not-stated", edit(t, mqttIn, withRetain, noRetain), []string{"spec.conversion.losses loss-undeclared"}},
		{"core-nats-retained", edit(t, natsIn, "  routes:", lastValue), []string{"spec.lastValue.mode last-value-retained"}},
		{"core-nats-all", edit(t, natsIn, "  routes:", "  lastValue:\n    mode: all\n  routes:"), nil},
		{"amqp-retained", edit(t, amqpIn, "  routes:", lastValue), []string{"spec.lastValue.mode last-value-retained"}},
		// Each driver says what its sources keep: a JetStream stream
		// keeps the last message per subject, a shared MQTT
		// subscription receives no retained message (MQTT 5 §4.8.2).
		{"jetstream-retained", edit(t, natsIn, "    url: nats://127.0.0.1:4222\n", "    url: nats://127.0.0.1:4222\n    nats: {jetstream: {stream: S, durable: d}}\n", "at-most-once, ", "", "  routes:", lastValue), nil},
		{"mqtt-shared-retained", edit(t, mqttIn, withRetain, noRetain, "      qos: 1\n", "      qos: 1\n      sharedGroup: g\n", "  routes:", lastValue), []string{"spec.lastValue.mode last-value-retained"}},
		{"mqtt-shared-all", edit(t, mqttIn, withRetain, noRetain, "      qos: 1\n", "      qos: 1\n      sharedGroup: g\n", "  routes:", "  lastValue:\n    mode: all\n  routes:"), nil},
		{"outbound", edit(t, natsOut, "  routes:", "  lastValue:\n    mode: all\n  routes:"), []string{"spec.lastValue direction-field"}},
		// Persistence is for caches no broker can seed again.
		{"core-nats-all-persist", edit(t, natsIn, "  routes:", "  lastValue:\n    mode: all\n    persist: true\n  routes:"), nil},
		{"amqp-all-persist", edit(t, amqpIn, "  routes:", "  lastValue:\n    mode: all\n    persist: true\n  routes:"), nil},
		{"jetstream-retained-persist", edit(t, natsIn, "    url: nats://127.0.0.1:4222\n", "    url: nats://127.0.0.1:4222\n    nats: {jetstream: {stream: S, durable: d}}\n", "at-most-once, ", "", "  routes:",
			"  lastValue:\n    mode: retained\n    persist: true\n  routes:"), []string{"spec.lastValue.persist last-value-persist"}},
		{"persist-not-bool", edit(t, natsIn, "  routes:", "  lastValue:\n    mode: all\n    persist: yes please\n  routes:"), []string{"spec.lastValue.persist type"}},
		{"bad-mode", edit(t, mqttIn, "  routes:", "  lastValue:\n    mode: some\n  routes:"), []string{"spec.lastValue.mode oneof"}},
		{"no-mode", edit(t, mqttIn, "  routes:", "  lastValue:\n    maxTopics: 3\n  routes:"), []string{"spec.lastValue.mode required"}},
		{"zero-topics", edit(t, mqttIn, withRetain, noRetain, "  routes:", "  lastValue:\n    mode: all\n    maxTopics: 0\n  routes:"), []string{"spec.lastValue.maxTopics min"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := loadFiles(t, "a.yaml", c.doc)
			for _, fe := range resources.Errors(err) {
				if (fe.Rule == "last-value-retained" || fe.Rule == "last-value-persist") && (fe.Message == "" || fe.Hint == "") {
					t.Errorf("%s: refused without a reason or a hint: %v", c.name, fe)
				}
			}
			var got []string
			for _, d := range diags(resources.Errors(err)) {
				got = append(got, d.String())
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("diagnostics %q, want %q", got, c.want)
			}
		})
	}
}

// TestLastValueSharedGroup: the refusal of a shared subscription with
// mode: retained says why (the standard forbids the retained messages the
// cache would hold) and what to write instead (issue 24, item 8).
func TestLastValueSharedGroup(t *testing.T) {
	doc := edit(t, mqttIn, "      qos: 1\n", "      qos: 1\n      sharedGroup: replicas\n", "  routes:", "  lastValue:\n    mode: retained\n  routes:",
		"retain, ", "")
	_, err := loadFiles(t, "a.yaml", doc)
	errs := resources.Errors(err)
	if len(errs) != 1 || errs[0].Rule != "last-value-retained" || errs[0].Field != "spec.lastValue.mode" {
		t.Fatalf("errors %v, want one last-value-retained at spec.lastValue.mode", err)
	}
	for _, want := range []string{"sharedGroup", "shared subscription", "§4.8.2", "Mosquitto"} {
		if !strings.Contains(errs[0].Message, want) {
			t.Errorf("message %q does not name %q", errs[0].Message, want)
		}
	}
	if !strings.Contains(errs[0].Hint, "remove sharedGroup") || !strings.Contains(errs[0].Hint, "mode: all") {
		t.Errorf("hint %q names neither way out", errs[0].Hint)
	}
}

// TestLastValueSourceOptions: maxAge, whenSourceDown and orphanAfter are
// read, and refused with the field named when they make no sense.
func TestLastValueSourceOptions(t *testing.T) {
	const noRetain = "losses: [delivery-best-effort, dotted-levels, expiry, ordering, properties, reply-to, topic-length]"
	const withRetain = "losses: [delivery-best-effort, dotted-levels, expiry, ordering, properties, reply-to, retain, topic-length]"
	with := func(opts string) string {
		return edit(t, mqttIn, withRetain, noRetain, "  routes:", "  lastValue:\n    mode: retained\n"+opts+"  routes:")
	}
	set, err := loadFiles(t, "a.yaml", with("    maxAge: 90s\n    whenSourceDown: withhold\n    orphanAfter: 1h\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := resources.LastValue{Mode: "retained", MaxTopics: resources.DefaultLastValueTopics, MaxBytes: resources.DefaultLastValueBytes,
		MaxAge: 90 * time.Second, WhenSourceDown: "withhold", OrphanAfter: time.Hour}
	if c := set.Connectors()[0]; c.LastValue != want {
		t.Errorf("LastValue = %+v, want %+v", c.LastValue, want)
	}
	set, err = loadFiles(t, "a.yaml", with("    whenSourceDown: mark\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c := set.Connectors()[0]; c.LastValue.WhenSourceDown != "" {
		t.Errorf("whenSourceDown: mark reads as %q, want the default \"\"", c.LastValue.WhenSourceDown)
	}
	for _, c := range []struct{ name, opts, want string }{
		{"bad-when", "    whenSourceDown: hide\n", "spec.lastValue.whenSourceDown oneof"},
		{"zero-age", "    maxAge: 0s\n", "spec.lastValue.maxAge positive-duration"},
		{"negative-orphan", "    orphanAfter: -1m\n", "spec.lastValue.orphanAfter positive-duration"},
	} {
		_, err := loadFiles(t, "a.yaml", with(c.opts))
		errs := resources.Errors(err)
		var got []string
		for _, d := range diags(errs) {
			got = append(got, d.String())
		}
		if !slices.Equal(got, []string{c.want}) {
			t.Errorf("%s: diagnostics %q, want %q", c.name, got, c.want)
		}
		for _, fe := range errs {
			if fe.Message == "" || fe.Hint == "" && fe.Rule == "positive-duration" {
				t.Errorf("%s: refused without a reason or a hint: %v", c.name, fe)
			}
		}
	}
}
