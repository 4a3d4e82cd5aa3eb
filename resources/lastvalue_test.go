package resources_test

import (
	"slices"
	"testing"

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
		{"outbound", edit(t, natsOut, "  routes:", "  lastValue:\n    mode: all\n  routes:"), []string{"spec.lastValue direction-field"}},
		{"bad-mode", edit(t, mqttIn, "  routes:", "  lastValue:\n    mode: some\n  routes:"), []string{"spec.lastValue.mode oneof"}},
		{"no-mode", edit(t, mqttIn, "  routes:", "  lastValue:\n    maxTopics: 3\n  routes:"), []string{"spec.lastValue.mode required"}},
		{"zero-topics", edit(t, mqttIn, withRetain, noRetain, "  routes:", "  lastValue:\n    mode: all\n    maxTopics: 0\n  routes:"), []string{"spec.lastValue.maxTopics min"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := loadFiles(t, "a.yaml", c.doc)
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
