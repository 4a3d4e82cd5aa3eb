package resources_test

import (
	"slices"
	"strings"
	"testing"
)

func TestCrossResource(t *testing.T) {
	const fp = "sha256:9091e5f37dc3e870fcce55bf2721bd5db9e7ba9067b3b8067fd12f0153a52b98"
	mqttIn2 := func(t *testing.T, name string, edits ...string) string {
		doc := rename(t, mqttIn, "mqtt-in", name)
		doc = edit(t, doc, "    mqtt:\n", "    clientID: "+name+"\n    mqtt:\n")
		if len(edits) > 0 {
			doc = edit(t, doc, edits...)
		}
		return doc
	}
	tests := []struct {
		name string
		docs []string
		want []diag // for every document alike
	}{
		{"distinct", []string{mqttIn, natsIn, amqpIn, mqttOut, natsOut, amqpOut}, nil},
		{"same name", []string{mqttIn, rename(t, natsIn, "nats-in", "mqtt-in")}, []diag{{"metadata.name", "name-duplicate"}}},
		{"same endpoint", []string{mqttIn2(t, "a"), mqttIn2(t, "b")}, []diag{{"spec.weida.listen", "weida-endpoint-duplicate"}}},
		{"same endpoint, IPv6 spelt two ways", []string{
			mqttIn2(t, "a", "127.0.0.1:7001", "[::1]:7001"),
			mqttIn2(t, "b", "127.0.0.1:7001", "[0:0:0:0:0:0:0:1]:7001"),
		}, []diag{{"spec.weida.listen", "weida-endpoint-duplicate"}}},
		{"same address, other paths", []string{mqttIn2(t, "a"), mqttIn2(t, "b", "/sensors", "/other")}, nil},
		{"same address, generated and file certificate", []string{
			mqttIn2(t, "a"),
			mqttIn2(t, "b", "/sensors", "/other\n    certFile: c.pem\n    keyFile: k.pem"),
		}, []diag{{"", "weida-listen-certificate"}}},
		{"same address, two certificate files", []string{
			mqttIn2(t, "a", "/sensors", "/one\n    certFile: c1.pem\n    keyFile: k1.pem"),
			mqttIn2(t, "b", "/sensors", "/other\n    certFile: c2.pem\n    keyFile: k2.pem"),
		}, []diag{{"spec.weida.certFile", "weida-listen-certificate"}}},
		{"same address, same certificate", []string{
			mqttIn2(t, "a", "/sensors", "/one\n    certFile: c.pem\n    keyFile: k.pem"),
			mqttIn2(t, "b", "/sensors", "/other\n    certFile: c.pem\n    keyFile: k.pem"),
		}, nil},
		{"same address, other clients", []string{
			mqttIn2(t, "a", "/sensors", "/one\n    allowedClients: ["+fp+"]"),
			mqttIn2(t, "b", "/sensors", "/other"),
		}, []diag{{"", "weida-listen-clients"}}},
		{"same address, same clients, other client CA", []string{
			mqttIn2(t, "a", "/sensors", "/one\n    clientCAFile: ca1.pem\n    allowedClients: [{san: 'dns:a.example'}]"),
			mqttIn2(t, "b", "/sensors", "/other\n    clientCAFile: ca2.pem\n    allowedClients: [{san: 'dns:a.example'}]"),
		}, []diag{{"spec.weida.allowedClients", "weida-listen-clients"}}},
		{"same address, same clients, same client CA", []string{
			mqttIn2(t, "a", "/sensors", "/one\n    clientCAFile: ca.pem\n    allowedClients: [{san: 'dns:a.example', scopes: [a.#]}]"),
			mqttIn2(t, "b", "/sensors", "/other\n    clientCAFile: ca.pem\n    allowedClients: [{san: 'dns:a.example'}]"),
		}, nil},
		{"same address, other buffer", []string{
			mqttIn2(t, "a", "  routes:\n", "  limits: {bufferBytes: 16MiB}\n  routes:\n"),
			mqttIn2(t, "b", "/sensors", "/other"),
		}, []diag{{"spec.limits.bufferBytes", "weida-listen-limits"}}},
		{"same address, other connection limits", []string{
			mqttIn2(t, "a", "/sensors", "/one\n    maxConnectionsPerAddress: 8"),
			mqttIn2(t, "b", "/sensors", "/other"),
		}, []diag{{"spec.weida.maxConnections", "weida-listen-limits"}}},
		{"same address, same connection limits", []string{
			mqttIn2(t, "a", "/sensors", "/one\n    maxConnections: 4096\n    maxConnectionsPerAddress: 8"),
			mqttIn2(t, "b", "/sensors", "/other\n    maxConnections: 4096\n    maxConnectionsPerAddress: 8"),
		}, nil},
		{"same address, other idle timeout", []string{
			mqttIn2(t, "a", "/sensors", "/one\n    idleTimeout: 10s"),
			mqttIn2(t, "b", "/sensors", "/other"),
		}, []diag{{"spec.weida.idleTimeout", "weida-listen-limits"}}},
		{"same address, same idle timeout", []string{
			mqttIn2(t, "a", "/sensors", "/one\n    idleTimeout: 10s"),
			mqttIn2(t, "b", "/sensors", "/other\n    idleTimeout: 10s"),
		}, nil},
		{"wildcard and loopback on one port", []string{
			mqttIn2(t, "a", "127.0.0.1:7001", "0.0.0.0:7001", "/sensors", "/one\n    allowedClients: ["+fp+"]"),
			mqttIn2(t, "b", "/sensors", "/other"),
		}, []diag{{"spec.weida.listen", "weida-listen-overlap"}}},
		{"two addresses on one port", []string{mqttIn2(t, "a", "127.0.0.1:7001", "127.0.0.2:7001"), mqttIn2(t, "b")}, nil},
		{"outbound resources dial one endpoint", []string{mqttOut, rename(t, mqttOut, "mqtt-out", "other")}, nil},
		{"same MQTT client id", []string{
			edit(t, mqttIn, "    mqtt:\n", "    clientID: bridge\n    mqtt:\n"),
			edit(t, mqttOut, "    url: mqtt://127.0.0.1:1883\n", "    url: mqtt://127.0.0.1:1883\n    clientID: bridge\n"),
		}, []diag{{"spec.broker.clientID", "broker-client-id-duplicate"}}},
		{"same MQTT client id, other brokers", []string{
			edit(t, mqttIn, "    mqtt:\n", "    clientID: bridge\n    mqtt:\n"),
			edit(t, mqttOut, "    url: mqtt://127.0.0.1:1883\n", "    url: mqtt://127.0.0.1:1884\n    clientID: bridge\n"),
		}, nil},
		{"same MQTT client id, default port spelt out", []string{
			edit(t, mqttIn, "mqtt://127.0.0.1:1883", "mqtt://127.0.0.1", "    mqtt:\n", "    clientID: bridge\n    mqtt:\n"),
			edit(t, mqttOut, "    url: mqtt://127.0.0.1:1883\n", "    url: mqtt://127.0.0.1:1883\n    clientID: bridge\n"),
		}, []diag{{"spec.broker.clientID", "broker-client-id-duplicate"}}},
		{"same NATS connection name is harmless", []string{
			edit(t, natsIn, "    url: nats://127.0.0.1:4222\n", "    url: nats://127.0.0.1:4222\n    clientID: bridge\n"),
			edit(t, natsOut, "    url: nats://127.0.0.1:4222\n", "    url: nats://127.0.0.1:4222\n    clientID: bridge\n"),
		}, nil},
		{"same JetStream durable", []string{
			edit(t, natsIn, "    url: nats://127.0.0.1:4222\n", "    url: nats://127.0.0.1:4222\n    nats: {jetstream: {stream: S, durable: d}}\n", "at-most-once, ", ""),
			edit(t, rename(t, natsIn, "nats-in", "b"), "7003/orders", "7003/b", "    url: nats://127.0.0.1:4222\n", "    url: nats://127.0.0.1:4222\n    nats: {jetstream: {stream: S, durable: d}}\n", "at-most-once, ", ""),
		}, []diag{{"spec.broker.nats.jetstream.durable", "broker-consumer-duplicate"}}},
		{"same AMQP queue", []string{
			edit(t, amqpIn, "  weida:\n", "    amqp: {queue: {name: q, durable: true, exclusive: false}}\n  weida:\n"),
			edit(t, rename(t, amqpIn, "amqp-in", "b"), "7004/audit", "7004/b", "  weida:\n", "    amqp: {queue: {name: q, durable: true, exclusive: false}}\n  weida:\n"),
		}, []diag{{"spec.broker.amqp.queue.name", "broker-queue-duplicate"}}},
		{"same AMQP queue name in other vhosts", []string{
			edit(t, amqpIn, "  weida:\n", "    amqp: {queue: {name: q, durable: true, exclusive: false}}\n  weida:\n"),
			edit(t, rename(t, amqpIn, "amqp-in", "b"), "5672/", "5672/other", "7004/audit", "7004/b", "  weida:\n", "    amqp: {queue: {name: q, durable: true, exclusive: false}}\n  weida:\n"),
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var files []string
			for i, d := range tt.docs {
				files = append(files, string(rune('a'+i))+".yaml", d)
			}
			set, _ := loadFiles(t, files...)
			checkWellFormed(t, set)
			for _, d := range set.Documents {
				got := diags(d.Errors)
				// The field may depend on the document; "" in want means "any".
				ok := len(got) == len(tt.want)
				for i := 0; ok && i < len(got); i++ {
					ok = got[i].rule == tt.want[i].rule && (tt.want[i].field == "" || got[i].field == tt.want[i].field)
				}
				if !ok {
					t.Errorf("%s (%s): got %v, want %v\n%s", d.Name, d.Source, got, tt.want, dump(set))
				}
				// Each error names the other resource.
				for _, e := range d.Errors {
					for _, o := range set.Documents {
						if o != d && !strings.Contains(e.Message, o.Source.String()) {
							t.Errorf("%v does not name %s", e, o.Source)
						}
					}
				}
			}
		})
	}
}

func TestCrossResourceWithOtherErrors(t *testing.T) {
	// A resource with an unrelated mistake still takes part in the checks.
	a := edit(t, mqttIn, "qos: 1", "qos: 2")
	b := edit(t, rename(t, mqttIn, "mqtt-in", "b"), "    mqtt:\n", "    clientID: other\n    mqtt:\n")
	_, err := loadFiles(t, "a.yaml", a, "b.yaml", b)
	got := sortedDiags(diags(Errors(err)))
	want := sortedDiags([]diag{{"spec.broker.mqtt.qos", "mqtt-qos-2"}, {"spec.weida.listen", "weida-endpoint-duplicate"}, {"spec.weida.listen", "weida-endpoint-duplicate"}})
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}
