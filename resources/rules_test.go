package resources_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestValidBaselines(t *testing.T) {
	for name, doc := range map[string]string{
		"mqttIn": mqttIn, "mqttOut": mqttOut, "natsIn": natsIn,
		"natsOut": natsOut, "amqpIn": amqpIn, "amqpOut": amqpOut,
	} {
		t.Run(name, func(t *testing.T) {
			set, err := loadFiles(t, "r.yaml", doc)
			if err != nil {
				t.Fatalf("baseline invalid:\n%v", err)
			}
			checkWellFormed(t, set)
			if got := len(set.Connectors()); got != 1 {
				t.Fatalf("%d connectors, want 1", got)
			}
		})
	}
}

// TestRules covers each rule with one resource that breaks it and nothing
// else, and pins which field and which rule the error names.
func TestRules(t *testing.T) {
	const fp = "sha256:9091e5f37dc3e870fcce55bf2721bd5db9e7ba9067b3b8067fd12f0153a52b98"
	fp2 := "sha256:" + strings.Repeat("0f", 32)
	manyRoutes := "routes:\n"
	for i := range 257 {
		manyRoutes += fmt.Sprintf("    - filter: s/%d\n", i)
	}
	tests := []struct {
		name  string
		base  string
		edits []string
		want  []diag
	}{
		// The envelope.
		{"apiVersion missing", mqttIn, []string{"apiVersion: connector.weida.dev/v1alpha1\n", ""}, []diag{{"apiVersion", "required"}}},
		{"apiVersion wrong", mqttIn, []string{"connector.weida.dev/v1alpha1", "v1"}, []diag{{"apiVersion", "apiversion"}}},
		{"kind wrong", mqttIn, []string{"kind: Connector", "kind: Deployment"}, []diag{{"kind", "kind"}}},
		{"name missing", mqttIn, []string{"  name: mqtt-in\n", "  labels: {}\n"}, []diag{{"metadata.name", "required"}}},
		{"name not a DNS label", mqttIn, []string{"name: mqtt-in", "name: Sensors_In"}, []diag{{"metadata.name", "dnslabel"}}},
		{"name too long", mqttIn, []string{"name: mqtt-in", "name: " + strings.Repeat("a", 64)}, []diag{{"metadata.name", "dnslabel"}}},
		{"label key", mqttIn, []string{"  name: mqtt-in\n", "  name: mqtt-in\n  labels: {\"-bad\": x}\n"}, []diag{{"metadata.labels[-bad]", "labelkey"}}},
		{"label value", mqttIn, []string{"  name: mqtt-in\n", "  name: mqtt-in\n  labels: {team: \"a b\"}\n"}, []diag{{"metadata.labels[team]", "labelvalue"}}},
		{"label with prefix", mqttIn, []string{"  name: mqtt-in\n", "  name: mqtt-in\n  labels: {app.kubernetes.io/name: x}\n"}, nil},
		{"spec missing", "apiVersion: connector.weida.dev/v1alpha1\nkind: Connector\nmetadata: {name: x}\n", nil, []diag{{"spec", "required"}}},
		{"protocol unknown", mqttIn, []string{"protocol: mqtt", "protocol: kafka"}, []diag{{"spec.protocol", "oneof"}}},
		{"direction unknown", mqttIn, []string{"direction: inbound", "direction: both"}, []diag{{"spec.direction", "oneof"}}},
		{"unknown top-level field", mqttIn, []string{"kind: Connector\n", "kind: Connector\nstatus: {}\n"}, []diag{{"status", "unknown-field"}}},
		{"unknown nested field", mqttIn, []string{"    url: mqtt://127.0.0.1:1883\n", "    url: mqtt://127.0.0.1:1883\n    clientId: x\n"}, []diag{{"spec.broker.clientId", "unknown-field"}}},
		{"unknown route field", mqttIn, []string{"- filter: sensors/+/temperature", "- filter: sensors/+/temperature\n      topic: x"}, []diag{{"spec.routes[0].topic", "unknown-field"}}},
		// A misspelt required field is reported once, as the unknown field
		// whose hint names the right one, not also as missing.
		{"misspelt required field", mqttIn, []string{"- filter: sensors/+/temperature", "- filtr: sensors/+/temperature"}, []diag{{"spec.routes[0].filtr", "unknown-field"}}},
		{"misspelt required section", mqttIn, []string{"  weida:\n", "  wieda:\n"}, []diag{{"spec.wieda", "unknown-field"}}},
		{"misspelt protocol", mqttIn, []string{"protocol: mqtt", "protocl: mqtt"}, []diag{{"spec.protocl", "unknown-field"}}},
		{"unknown field far from the missing one", mqttIn, []string{"- filter: sensors/+/temperature", "- topic: sensors/+/temperature"}, []diag{{"spec.routes[0].topic", "unknown-field"}, {"spec.routes[0].filter", "required"}}},
		{"duplicate key", mqttIn, []string{"    qos: 1\n", "    qos: 1\n      qos: 0\n"}, []diag{{"spec.broker.mqtt.qos", "duplicate-key"}}},
		{"string where a number belongs", mqttIn, []string{"qos: 1", "qos: one"}, []diag{{"spec.broker.mqtt.qos", "type"}}},
		{"number where a string belongs", mqttIn, []string{"name: mqtt-in", "name: 123"}, []diag{{"metadata.name", "type"}}},
		{"!!str makes a string", mqttIn, []string{"name: mqtt-in", "name: !!str 123"}, nil},
		{"scalar where a list belongs", mqttIn, []string{"losses: [", "losses: x\n    l: ["}, []diag{{"spec.conversion.l", "unknown-field"}, {"spec.conversion.losses", "type"}}},
		{"document is a list", "- a\n- b\n", nil, []diag{{"", "type"}}},
		{"unknown tag", mqttIn, []string{"qos: 1", "qos: !weird 1"}, []diag{{"spec.broker.mqtt.qos", "yaml-tag"}}},
		{"alias without anchor", mqttIn, []string{"qos: 1", "qos: *nothing"}, []diag{{"spec.broker.mqtt.qos", "yaml-alias"}}},
		{"anchor and alias", mqttIn, []string{"name: mqtt-in", "name: &n mqtt-in", "    mqtt:\n", "    clientID: *n\n    mqtt:\n"}, nil},
		{"merge key", mqttIn, []string{"    mqtt:\n      qos: 1\n", "    mqtt:\n      <<: {qos: 0, cleanStart: true}\n      qos: 1\n"}, nil},
		{"yaml syntax", mqttIn, []string{"qos: 1", "qos: [1"}, []diag{{"", "yaml-syntax"}}},

		// Routes.
		{"routes missing", mqttIn, []string{"  routes:\n    - filter: sensors/+/temperature\n", ""}, []diag{{"spec.routes", "required"}}},
		{"routes empty", mqttIn, []string{"  routes:\n    - filter: sensors/+/temperature\n", "  routes: []\n"}, []diag{{"spec.routes", "min"}}},
		{"too many routes", mqttIn, []string{"routes:\n    - filter: sensors/+/temperature\n", manyRoutes}, []diag{{"spec.routes", "max"}}},
		{"filter missing", mqttIn, []string{"- filter: sensors/+/temperature", "- name: x"}, []diag{{"spec.routes[0].filter", "required"}}},
		{"filter empty", mqttIn, []string{"filter: sensors/+/temperature", `filter: ""`}, []diag{{"spec.routes[0].filter", "mqtt-empty"}}},
		{"bare > is a YAML block", natsIn, []string{"orders.*.created", ">"}, []diag{{"spec.routes[0].filter", "yaml-quote"}}},
		{"bare # is a YAML comment", mqttIn, []string{"sensors/+/temperature", "#"}, []diag{{"spec.routes[0].filter", "required"}}},
		{"bare * is a YAML alias", natsIn, []string{"orders.*.created", "*.created"}, []diag{{"spec.routes[0].filter", "yaml-alias"}}},
		{"quoted wildcards", natsIn, []string{"orders.*.created", `"*.created"`}, nil},
		{"filter repeated", mqttIn, []string{"- filter: sensors/+/temperature", "- filter: sensors/+/temperature\n    - filter: sensors/+/temperature"}, []diag{{"spec.routes[1].filter", "route-duplicate"}}},
		{"route name repeated", mqttIn, []string{"- filter: sensors/+/temperature", "- {name: t, filter: a}\n    - {name: t, filter: b}"}, []diag{{"spec.routes[1].name", "route-name-duplicate"}}},
		{"route name invalid", mqttIn, []string{"- filter: sensors/+/temperature", "- {name: T_1, filter: a}"}, []diag{{"spec.routes[0].name", "dnslabel"}}},
		{"nats one-or-more", natsIn, []string{"orders.*.created", "orders.>"}, []diag{{"spec.routes[0].filter", "nats-one-or-more"}}},
		{"amqp hash then literal", amqpIn, []string{"audit.events.#", `"#.leaf"`}, []diag{{"spec.routes[0].filter", "amqp-hash-then-literal"}}},
		{"amqp empty binding key", amqpIn, []string{"audit.events.#", `""`}, []diag{{"spec.routes[0].filter", "amqp-empty-binding-key"}}},
		{"mqtt shared subscription in a filter", mqttIn, []string{"sensors/+/temperature", "$share/g/sensors/#"}, []diag{{"spec.routes[0].filter", "mqtt-shared-subscription"}}},
		{"mqtt dotted level", mqttIn, []string{"sensors/+/temperature", "sensors/v1.2/#"}, []diag{{"spec.routes[0].filter", "mqtt-dotted-level"}}},
		{"two refused routes, both reported", natsIn, []string{"- filter: orders.*.created", "- filter: a.>\n    - filter: ok.*\n    - filter: b.#"}, []diag{{"spec.routes[0].filter", "nats-one-or-more"}, {"spec.routes[2].filter", "nats-hash-token"}}},

		// Conversion.
		{"policy unknown", mqttIn, []string{"  conversion:\n", "  conversion:\n    policy: mqtt-magic/v9\n"}, []diag{{"spec.conversion.policy", "unknown-policy"}}},
		{"policy of another protocol", mqttIn, []string{"  conversion:\n", "  conversion:\n    policy: nats-tokens/v1\n"}, []diag{{"spec.conversion.policy", "policy-protocol"}}},
		{"escaped policy carries dotted levels", mqttIn, []string{"  conversion:\n", "  conversion:\n    policy: mqtt-levels-escaped/v1\n", "dotted-levels, ", ""}, nil},
		{"missing loss", mqttIn, []string{"retain, ", ""}, []diag{{"spec.conversion.losses", "loss-undeclared"}}},
		{"losses missing entirely", natsIn, []string{"  conversion:\n    losses: [at-most-once, delivery-best-effort, non-utf8-names, ordering, properties, reply-to, topic-length]\n", ""},
			[]diag{{"spec.conversion.losses", "loss-undeclared"}}}, // one error listing them all
		// Several losses missing: one error lists them all.
		{"several losses missing", natsIn, []string{"losses: [at-most-once, delivery-best-effort, non-utf8-names, ordering, properties, reply-to, topic-length]", "losses: [at-most-once, delivery-best-effort, non-utf8-names]"},
			[]diag{{"spec.conversion.losses", "loss-undeclared"}}},
		{"losses written empty", natsIn, []string{"losses: [at-most-once, delivery-best-effort, non-utf8-names, ordering, properties, reply-to, topic-length]", "losses: []"},
			[]diag{{"spec.conversion.losses", "loss-undeclared"}}},
		{"extra loss", amqpOut, []string{"ordering, ", "ordering, retain, "}, []diag{{"spec.conversion.losses[3]", "loss-not-incurred"}}},
		{"unknown loss", amqpOut, []string{"ordering, ", "ordering, retian, "}, []diag{{"spec.conversion.losses[3]", "loss-unknown"}}},
		{"loss twice", amqpOut, []string{"ordering, ", "ordering, ordering, "}, []diag{{"spec.conversion.losses", "unique"}}},
		{"qos 0 must state at-most-once", mqttIn, []string{"qos: 1", "qos: 0"}, []diag{{"spec.conversion.losses", "loss-undeclared"}}},
		{"qos 0 stating at-most-once", mqttIn, []string{"qos: 1", "qos: 0", "[delivery", "[at-most-once, delivery"}, nil},
		{"jetstream drops at-most-once", natsIn, []string{"    url: nats://127.0.0.1:4222\n", "    url: nats://127.0.0.1:4222\n    nats: {jetstream: {stream: ORDERS, durable: d}}\n"}, []diag{{"spec.conversion.losses[0]", "loss-not-incurred"}}},

		// MQTT options.
		{"qos 2", mqttIn, []string{"qos: 1", "qos: 2"}, []diag{{"spec.broker.mqtt.qos", "mqtt-qos-2"}}},
		{"qos 3", mqttIn, []string{"qos: 1", "qos: 3"}, []diag{{"spec.broker.mqtt.qos", "mqtt-qos"}}},
		{"session expiry fraction", mqttIn, []string{"qos: 1", "qos: 1\n      sessionExpiry: 1500ms"}, []diag{{"spec.broker.mqtt.sessionExpiry", "sessionexpiry"}}},
		{"session expiry not a duration", mqttIn, []string{"qos: 1", "qos: 1\n      sessionExpiry: soon"}, []diag{{"spec.broker.mqtt.sessionExpiry", "duration"}}},
		{"session expiry negative", mqttIn, []string{"qos: 1", "qos: 1\n      sessionExpiry: -1s"}, []diag{{"spec.broker.mqtt.sessionExpiry", "sessionexpiry"}}},
		{"shared group", mqttIn, []string{"qos: 1", "qos: 1\n      sharedGroup: replicas"}, nil},
		{"shared group with slash", mqttIn, []string{"qos: 1", "qos: 1\n      sharedGroup: a/b"}, []diag{{"spec.broker.mqtt.sharedGroup", "sharename"}}},
		{"shared group outbound", mqttOut, []string{"    url: mqtt://127.0.0.1:1883\n", "    url: mqtt://127.0.0.1:1883\n    mqtt: {sharedGroup: g}\n"}, []diag{{"spec.broker.mqtt.sharedGroup", "direction-field"}}},

		// Broker URL and sections.
		{"url missing", mqttIn, []string{"    url: mqtt://127.0.0.1:1883\n", ""}, []diag{{"spec.broker.url", "required"}}},
		{"url of another protocol", mqttIn, []string{"mqtt://127.0.0.1", "nats://127.0.0.1"}, []diag{{"spec.broker.url", "broker-url-scheme"}}},
		{"url tcp scheme", mqttIn, []string{"mqtt://127.0.0.1", "tcp://127.0.0.1"}, []diag{{"spec.broker.url", "broker-url-scheme"}}},
		{"url with credentials", amqpOut, []string{"amqp://127.0.0.1", "amqp://guest:guest@127.0.0.1"}, []diag{{"spec.broker.url", "broker-url-credentials"}}},
		{"url with query", amqpOut, []string{"5672/", "5672/?heartbeat=10"}, []diag{{"spec.broker.url", "broker-url"}}},
		{"url without host", natsIn, []string{"nats://127.0.0.1:4222", "nats://"}, []diag{{"spec.broker.url", "broker-url"}}},
		{"url bad port", natsIn, []string{"4222", "99999"}, []diag{{"spec.broker.url", "broker-url"}}},
		{"url with path", natsIn, []string{"4222", "4222/x"}, []diag{{"spec.broker.url", "broker-url"}}},
		{"amqp vhost", amqpOut, []string{"5672/", "5672/prod"}, nil},
		{"amqp vhost nested", amqpOut, []string{"5672/", "5672/a/b"}, []diag{{"spec.broker.url", "broker-url"}}},
		{"tls over a plaintext scheme", mqttIn, []string{"    mqtt:\n", "    tls: {caFile: ca.pem}\n    mqtt:\n"}, []diag{{"spec.broker.tls", "tls-scheme"}}},
		{"tls", mqttIn, []string{"mqtt://127.0.0.1:1883", "mqtts://127.0.0.1:8883", "    mqtt:\n", "    tls: {caFile: ca.pem, certFile: c.pem, keyFile: k.pem, serverName: broker.local}\n    mqtt:\n"}, nil},
		{"tls cert without key", natsIn, []string{"nats://", "tls://", "    url: tls://127.0.0.1:4222\n", "    url: tls://127.0.0.1:4222\n    tls: {certFile: c.pem}\n"}, []diag{{"spec.broker.tls.keyFile", "required_with"}}},
		{"tls server name", natsIn, []string{"nats://", "tls://", "    url: tls://127.0.0.1:4222\n", "    url: tls://127.0.0.1:4222\n    tls: {serverName: \"bad name\"}\n"}, []diag{{"spec.broker.tls.serverName", "hostname_rfc1123"}}},
		{"section of another protocol", mqttIn, []string{"    mqtt:\n", "    nats: {queueGroup: g}\n    mqtt:\n"}, []diag{{"spec.broker.nats", "protocol-section"}}},
		{"client id with an environment variable", mqttIn, []string{"    mqtt:\n", "    clientID: orders-${HOSTNAME}\n    mqtt:\n"}, nil},
		{"client id with a malformed variable", mqttIn, []string{"    mqtt:\n", "    clientID: orders-${HOST-NAME}\n    mqtt:\n"}, []diag{{"spec.broker.clientID", "clientid-variable"}}},
		{"client id with an unclosed variable", mqttIn, []string{"    mqtt:\n", "    clientID: orders-${HOSTNAME\n    mqtt:\n"}, []diag{{"spec.broker.clientID", "clientid-variable"}}},
		{"client id with a dollar alone", mqttIn, []string{"    mqtt:\n", "    clientID: a$b\n    mqtt:\n"}, nil},
		{"client id with control character", mqttIn, []string{"    mqtt:\n", "    clientID: \"a\\tb\"\n    mqtt:\n"}, []diag{{"spec.broker.clientID", "clientid"}}},

		// Credentials.
		{"literal password", mqttIn, []string{"    mqtt:\n", "    credentials: {username: u, password: hunter2}\n    mqtt:\n"}, []diag{{"spec.broker.credentials.password", "secret-literal"}}},
		{"literal numeric password", mqttIn, []string{"    mqtt:\n", "    credentials: {username: u, password: 1234}\n    mqtt:\n"}, []diag{{"spec.broker.credentials.password", "secret-literal"}}},
		{"secret with env and file", mqttIn, []string{"    mqtt:\n", "    credentials: {username: u, password: {env: P, file: /p}}\n    mqtt:\n"}, []diag{{"spec.broker.credentials.password", "secret-ref"}}},
		{"secret empty", mqttIn, []string{"    mqtt:\n", "    credentials: {username: u, password: {}}\n    mqtt:\n"}, []diag{{"spec.broker.credentials.password", "secret-ref"}}},
		{"secret unknown key", mqttIn, []string{"    mqtt:\n", "    credentials: {username: u, password: {vault: x, env: P}}\n    mqtt:\n"}, []diag{{"spec.broker.credentials.password.vault", "unknown-field"}}},
		{"secret env name", mqttIn, []string{"    mqtt:\n", "    credentials: {username: u, password: {env: 1PASS}}\n    mqtt:\n"}, []diag{{"spec.broker.credentials.password.env", "secret-env-name"}}},
		{"mqtt username alone", mqttIn, []string{"    mqtt:\n", "    credentials: {username: u}\n    mqtt:\n"}, nil},
		{"password without username", mqttIn, []string{"    mqtt:\n", "    credentials: {password: {env: P}}\n    mqtt:\n"}, []diag{{"spec.broker.credentials.password", "credentials-incomplete"}}},
		{"amqp username without password", amqpIn, []string{"      password: {env: AMQP_PASSWORD}\n", ""}, []diag{{"spec.broker.credentials.username", "credentials-incomplete"}}},
		{"nats token for mqtt", mqttIn, []string{"    mqtt:\n", "    credentials: {token: {env: T}}\n    mqtt:\n"}, []diag{{"spec.broker.credentials.token", "credentials-protocol"}}},
		{"nats token", natsIn, []string{"    url: nats://127.0.0.1:4222\n", "    url: nats://127.0.0.1:4222\n    credentials: {token: {env: T}}\n"}, nil},
		{"nats creds file", natsIn, []string{"    url: nats://127.0.0.1:4222\n", "    url: nats://127.0.0.1:4222\n    credentials: {creds: {file: user.creds}}\n"}, nil},
		{"nats two methods", natsIn, []string{"    url: nats://127.0.0.1:4222\n", "    url: nats://127.0.0.1:4222\n    credentials: {token: {env: T}, nkeySeed: {file: seed}}\n"}, []diag{{"spec.broker.credentials", "credentials-conflict"}}},

		// NATS options.
		{"queue group", natsIn, []string{"    url: nats://127.0.0.1:4222\n", "    url: nats://127.0.0.1:4222\n    nats: {queueGroup: q}\n"}, nil},
		{"queue group with space", natsIn, []string{"    url: nats://127.0.0.1:4222\n", "    url: nats://127.0.0.1:4222\n    nats: {queueGroup: a b}\n"}, []diag{{"spec.broker.nats.queueGroup", "natsname"}}},
		{"queue group outbound", natsOut, []string{"    url: nats://127.0.0.1:4222\n", "    url: nats://127.0.0.1:4222\n    nats: {queueGroup: q}\n"}, []diag{{"spec.broker.nats.queueGroup", "direction-field"}}},
		{"jetstream inbound without durable", natsIn, []string{"    url: nats://127.0.0.1:4222\n", "    url: nats://127.0.0.1:4222\n    nats: {jetstream: {stream: ORDERS}}\n", "at-most-once, ", ""}, []diag{{"spec.broker.nats.jetstream.durable", "required"}}},
		{"jetstream without stream", natsIn, []string{"    url: nats://127.0.0.1:4222\n", "    url: nats://127.0.0.1:4222\n    nats: {jetstream: {durable: d}}\n", "at-most-once, ", ""}, []diag{{"spec.broker.nats.jetstream.stream", "required"}}},
		{"jetstream stream name", natsIn, []string{"    url: nats://127.0.0.1:4222\n", "    url: nats://127.0.0.1:4222\n    nats: {jetstream: {stream: a.b, durable: d}}\n", "at-most-once, ", ""}, []diag{{"spec.broker.nats.jetstream.stream", "jsname"}}},
		{"jetstream outbound durable", natsOut, []string{"    url: nats://127.0.0.1:4222\n", "    url: nats://127.0.0.1:4222\n    nats: {jetstream: {stream: S, durable: d}}\n", "at-most-once, ", ""}, []diag{{"spec.broker.nats.jetstream.durable", "direction-field"}}},
		{"jetstream outbound", natsOut, []string{"    url: nats://127.0.0.1:4222\n", "    url: nats://127.0.0.1:4222\n    nats: {jetstream: {stream: S}}\n", "at-most-once, ", ""}, nil},
		{"jetstream with queue group", natsIn, []string{"    url: nats://127.0.0.1:4222\n", "    url: nats://127.0.0.1:4222\n    nats: {queueGroup: q, jetstream: {stream: S, durable: d}}\n", "at-most-once, ", ""}, []diag{{"spec.broker.nats.queueGroup", "jetstream-queue-group"}}},

		// AMQP options.
		{"amqp queue", amqpIn, []string{"  weida:\n", "    amqp: {exchange: events, queue: {name: q, durable: true, exclusive: false}, prefetch: 10}\n  weida:\n"}, nil},
		{"amqp exchange name", amqpIn, []string{"  weida:\n", "    amqp: {exchange: \"a b\"}\n  weida:\n"}, []diag{{"spec.broker.amqp.exchange", "amqpname"}}},
		{"amqp queue outbound", amqpOut, []string{"  weida:\n", "    amqp: {queue: {name: q}}\n  weida:\n"}, []diag{{"spec.broker.amqp.queue", "direction-field"}}},
		{"amqp prefetch outbound", amqpOut, []string{"  weida:\n", "    amqp: {prefetch: 5}\n  weida:\n"}, []diag{{"spec.broker.amqp.prefetch", "direction-field"}}},
		{"amqp prefetch zero", amqpIn, []string{"  weida:\n", "    amqp: {prefetch: 0}\n  weida:\n"}, []diag{{"spec.broker.amqp.prefetch", "min"}}},
		{"amqp reserved queue name", amqpIn, []string{"  weida:\n", "    amqp: {queue: {name: amq.mine}}\n  weida:\n"}, []diag{{"spec.broker.amqp.queue.name", "amqp-reserved-name"}}},
		{"amqp durable unnamed queue", amqpIn, []string{"  weida:\n", "    amqp: {queue: {durable: true, exclusive: false}}\n  weida:\n"}, []diag{{"spec.broker.amqp.queue.durable", "amqp-queue"}}},
		{"amqp shared unnamed queue", amqpIn, []string{"  weida:\n", "    amqp: {queue: {exclusive: false}}\n  weida:\n"}, []diag{{"spec.broker.amqp.queue.exclusive", "amqp-queue"}}},
		{"amqp quorum queue", amqpIn, []string{"  weida:\n", "    amqp: {queue: {name: q, type: quorum, durable: true, exclusive: false}}\n  weida:\n"}, nil},
		{"amqp quorum queue not durable", amqpIn, []string{"  weida:\n", "    amqp: {queue: {name: q, type: quorum, exclusive: false}}\n  weida:\n"}, []diag{{"spec.broker.amqp.queue.type", "amqp-queue"}}},
		{"amqp quorum queue unnamed", amqpIn, []string{"  weida:\n", "    amqp: {queue: {type: quorum}}\n  weida:\n"}, []diag{{"spec.broker.amqp.queue.type", "amqp-queue"}}},
		{"amqp passive queue", amqpIn, []string{"  weida:\n", "    amqp: {queue: {name: q, passive: true}}\n  weida:\n"}, nil},
		{"amqp passive queue unnamed", amqpIn, []string{"  weida:\n", "    amqp: {queue: {passive: true}}\n  weida:\n"}, []diag{{"spec.broker.amqp.queue.passive", "amqp-queue"}}},
		{"amqp passive queue with durable", amqpIn, []string{"  weida:\n", "    amqp: {queue: {name: q, passive: true, durable: true}}\n  weida:\n"}, []diag{{"spec.broker.amqp.queue.passive", "amqp-queue"}}},
		{"amqp queue type unknown", amqpIn, []string{"  weida:\n", "    amqp: {queue: {name: q, type: stream}}\n  weida:\n"}, []diag{{"spec.broker.amqp.queue.type", "oneof"}}},
		{"amqp durable exclusive queue", amqpIn, []string{"  weida:\n", "    amqp: {queue: {name: q, durable: true, exclusive: true}}\n  weida:\n"}, []diag{{"spec.broker.amqp.queue.exclusive", "amqp-queue"}}},

		// The weida side.
		{"weida missing", mqttIn, []string{"  weida:\n    listen: weida://127.0.0.1:7001/sensors\n", ""}, []diag{{"spec.weida", "required"}}},
		{"inbound without listen", mqttIn, []string{"listen: weida://127.0.0.1:7001/sensors", "certFile: c.pem\n    keyFile: k.pem"}, []diag{{"spec.weida.listen", "required"}}},
		{"inbound with dial", mqttIn, []string{"listen:", "dial:"}, []diag{{"spec.weida.dial", "direction-field"}}},
		{"inbound with caFile", mqttIn, []string{"7001/sensors", "7001/sensors\n    caFile: ca.pem"}, []diag{{"spec.weida.caFile", "direction-field"}}},
		{"listen without port", mqttIn, []string{"127.0.0.1:7001/sensors", "127.0.0.1/sensors"}, []diag{{"spec.weida.listen", "weida-url"}}},
		{"listen without path", mqttIn, []string{"127.0.0.1:7001/sensors", "127.0.0.1:7001"}, []diag{{"spec.weida.listen", "weida-url"}}},
		{"listen with a pin", mqttIn, []string{"weida://127.0.0.1:7001", "weida://" + fp + "@127.0.0.1:7001"}, []diag{{"spec.weida.listen", "weida-listen-pin"}}},
		{"listen with certificate", mqttIn, []string{"7001/sensors", "7001/sensors\n    certFile: c.pem\n    keyFile: k.pem"}, nil},
		{"listen with cert but no key", mqttIn, []string{"7001/sensors", "7001/sensors\n    certFile: c.pem"}, []diag{{"spec.weida.keyFile", "required_with"}}},
		{"allowed clients", mqttIn, []string{"7001/sensors", "7001/sensors\n    allowedClients: [" + fp + "]"}, nil},
		{"allowed client malformed", mqttIn, []string{"7001/sensors", "7001/sensors\n    allowedClients: [sha256:ABC]"}, []diag{{"spec.weida.allowedClients[0]", "fingerprint"}}},
		{"allowed client twice", mqttIn, []string{"7001/sensors", "7001/sensors\n    allowedClients: [" + fp + ", " + fp + "]"}, []diag{{"spec.weida.allowedClients", "unique"}}},
		{"allowed client with scopes", mqttIn, []string{"7001/sensors", "7001/sensors\n    allowedClients:\n      - {client: " + fp + ", scopes: [plant.a.#, 'plant.*.temp', '']}"}, nil},
		{"allowed clients mixed forms", mqttIn, []string{"7001/sensors", "7001/sensors\n    allowedClients:\n      - " + fp2 + "\n      - client: " + fp + "\n        scopes: [plant.a.#]"}, nil},
		{"allowed client twice, two forms", mqttIn, []string{"7001/sensors", "7001/sensors\n    allowedClients: [" + fp + ", {client: " + fp + ", scopes: [a]}]"}, []diag{{"spec.weida.allowedClients", "unique"}}},
		{"scoped client malformed", mqttIn, []string{"7001/sensors", "7001/sensors\n    allowedClients: [{client: sha256:ABC, scopes: [a]}]"}, []diag{{"spec.weida.allowedClients[0].client", "fingerprint"}}},
		{"scoped client missing", mqttIn, []string{"7001/sensors", "7001/sensors\n    allowedClients: [{scopes: [a]}]"}, []diag{{"spec.weida.allowedClients[0].client", "required"}}},
		{"client by SAN", mqttIn, []string{"7001/sensors", "7001/sensors\n    clientCAFile: ca.pem\n    allowedClients:\n      - {san: 'dns:dash-7.plant-a.example', scopes: [plant.a.#]}\n      - {commonName: ops, scopes: ['#']}\n      - " + fp}, nil},
		{"client SAN kind unknown", mqttIn, []string{"7001/sensors", "7001/sensors\n    clientCAFile: ca.pem\n    allowedClients: [{san: 'ip:10.0.0.1'}]"}, []diag{{"spec.weida.allowedClients[0].san", "client-san"}, {"spec.weida.clientCAFile", "client-ca-unused"}}},
		{"client SAN is a CommonName", mqttIn, []string{"7001/sensors", "7001/sensors\n    clientCAFile: ca.pem\n    allowedClients: [{san: 'cn:ops'}, {commonName: x}]"}, []diag{{"spec.weida.allowedClients[0].san", "client-san"}}},
		{"client CommonName as a DN", mqttIn, []string{"7001/sensors", "7001/sensors\n    clientCAFile: ca.pem\n    allowedClients: [{commonName: 'CN=dash-7,O=plant-a'}, {commonName: x}]"}, []diag{{"spec.weida.allowedClients[0].commonName", "client-common-name"}}},
		{"client named twice", mqttIn, []string{"7001/sensors", "7001/sensors\n    clientCAFile: ca.pem\n    allowedClients: [{client: " + fp + ", san: 'dns:a.example'}, {commonName: x}]"}, []diag{{"spec.weida.allowedClients[0]", "client-one-name"}}},
		{"client SAN twice", mqttIn, []string{"7001/sensors", "7001/sensors\n    clientCAFile: ca.pem\n    allowedClients: [{san: 'dns:a.example'}, {san: 'dns:a.example', scopes: [a]}]"}, []diag{{"spec.weida.allowedClients", "unique"}}},
		{"client CA missing", mqttIn, []string{"7001/sensors", "7001/sensors\n    allowedClients: [{san: 'uri:spiffe://plant-a/dash'}]"}, []diag{{"spec.weida.clientCAFile", "required"}}},
		{"client CA unused", mqttIn, []string{"7001/sensors", "7001/sensors\n    clientCAFile: ca.pem\n    allowedClients: [" + fp + "]"}, []diag{{"spec.weida.clientCAFile", "client-ca-unused"}}},
		{"client CA outbound", mqttOut, []string{"    dial:", "    clientCAFile: ca.pem\n    dial:"}, []diag{{"spec.weida.clientCAFile", "direction-field"}}},
		{"scopes empty", mqttIn, []string{"7001/sensors", "7001/sensors\n    allowedClients: [{client: " + fp + ", scopes: []}]"}, []diag{{"spec.weida.allowedClients[0].scopes", "min"}}},
		{"scope hash not final", mqttIn, []string{"7001/sensors", "7001/sensors\n    allowedClients: [{client: " + fp + ", scopes: [ok, 'plant.#.x']}]"}, []diag{{"spec.weida.allowedClients[0].scopes[1]", "hash-not-final"}}},
		{"scope star not alone", mqttIn, []string{"7001/sensors", "7001/sensors\n    allowedClients: [{client: " + fp + ", scopes: ['plant.a*']}]"}, []diag{{"spec.weida.allowedClients[0].scopes[0]", "star-not-alone"}}},
		{"scope hash not alone", mqttIn, []string{"7001/sensors", "7001/sensors\n    allowedClients: [{client: " + fp + ", scopes: ['plant.a#']}]"}, []diag{{"spec.weida.allowedClients[0].scopes[0]", "hash-not-alone"}}},
		{"scope too long", mqttIn, []string{"7001/sensors", "7001/sensors\n    allowedClients: [{client: " + fp + ", scopes: [" + strings.Repeat("x", 257) + "]}]"}, []diag{{"spec.weida.allowedClients[0].scopes[0]", "too-long"}}},
		{"scope twice", mqttIn, []string{"7001/sensors", "7001/sensors\n    allowedClients: [{client: " + fp + ", scopes: [a, a]}]"}, []diag{{"spec.weida.allowedClients[0].scopes[1]", "unique"}}},
		{"scoped client unknown field", mqttIn, []string{"7001/sensors", "7001/sensors\n    allowedClients: [{client: " + fp + ", scope: [a]}]"}, []diag{{"spec.weida.allowedClients[0].scope", "unknown-field"}}},
		{"allowed client a number", mqttIn, []string{"7001/sensors", "7001/sensors\n    allowedClients: [12]"}, []diag{{"spec.weida.allowedClients[0]", "type"}}},
		{"outbound with scoped clients", mqttOut, []string{"7002/orders", "7002/orders\n    allowedClients: [{client: " + fp + ", scopes: [a]}]"}, []diag{{"spec.weida.allowedClients", "direction-field"}}},
		{"outbound without dial", mqttOut, []string{"    dial: weida://" + fp + "@127.0.0.1:7002/orders\n", "    caFile: ca.pem\n"}, []diag{{"spec.weida.dial", "required"}}},
		{"outbound with listen", mqttOut, []string{"dial:", "listen:"}, []diag{{"spec.weida.listen", "direction-field"}}},
		{"outbound with allowed clients", mqttOut, []string{"7002/orders", "7002/orders\n    allowedClients: [" + fp + "]"}, []diag{{"spec.weida.allowedClients", "direction-field"}}},
		{"outbound without trust", mqttOut, []string{fp + "@", ""}, []diag{{"spec.weida.dial", "weida-trust"}}},
		{"outbound with pin and caFile", mqttOut, []string{"7002/orders", "7002/orders\n    caFile: ca.pem"}, []diag{{"spec.weida.caFile", "weida-trust"}}},
		{"outbound client certificate", mqttOut, []string{"7002/orders", "7002/orders\n    certFile: c.pem\n    keyFile: k.pem"}, nil},
		{"dial bad fingerprint", mqttOut, []string{fp, "sha256:00"}, []diag{{"spec.weida.dial", "weida-url"}}},
		{"failover", mqttOut, []string{"7002/orders", "7002/orders\n    failover:\n      - weida://" + fp + "@127.0.0.2:7002/orders\n      - weida://" + fp + "@[::1]:7002/orders"}, nil},
		{"failover not a URL", mqttOut, []string{"7002/orders", "7002/orders\n    failover: [127.0.0.2:7002]"}, []diag{{"spec.weida.failover[0]", "weida-url"}}},
		{"failover other path", mqttOut, []string{"7002/orders", "7002/orders\n    failover: [weida://" + fp + "@127.0.0.2:7002/order]"}, []diag{{"spec.weida.failover[0]", "weida-failover-path"}}},
		{"failover without the pin", mqttOut, []string{"7002/orders", "7002/orders\n    failover: [weida://127.0.0.2:7002/orders]"}, []diag{{"spec.weida.failover[0]", "weida-failover-pin"}}},
		{"failover repeats dial", mqttOut, []string{"7002/orders", "7002/orders\n    failover: [weida://" + fp + "@127.0.0.1:7002/orders]"}, []diag{{"spec.weida.failover[0]", "weida-failover-duplicate"}}},
		{"failover twice", mqttOut, []string{"7002/orders", "7002/orders\n    failover: [weida://" + fp + "@h:1/orders, weida://" + fp + "@h:1/orders]"}, []diag{{"spec.weida.failover", "unique"}}},
		{"failover inbound", mqttIn, []string{"7001/sensors", "7001/sensors\n    failover: [weida://127.0.0.2:7001/sensors]"}, []diag{{"spec.weida.failover", "direction-field"}}},

		// Delivery.
		{"hold mqtt persistent session", mqttIn, []string{"  routes:\n", "  delivery: {whenNoSubscriber: hold}\n  routes:\n"}, nil},
		{"drop mqtt", mqttIn, []string{"  routes:\n", "  delivery: {whenNoSubscriber: drop}\n  routes:\n"}, nil},
		{"hold mqtt qos 0", mqttIn, []string{"qos: 1", "qos: 0", "delivery-best-effort,", "at-most-once, delivery-best-effort,", "  routes:\n", "  delivery: {whenNoSubscriber: hold}\n  routes:\n"}, []diag{{"spec.delivery.whenNoSubscriber", "delivery-hold"}}},
		{"hold mqtt clean start", mqttIn, []string{"qos: 1", "qos: 1\n      cleanStart: true", "  routes:\n", "  delivery: {whenNoSubscriber: hold}\n  routes:\n"}, []diag{{"spec.delivery.whenNoSubscriber", "delivery-hold"}}},
		{"hold mqtt no session expiry", mqttIn, []string{"qos: 1", "qos: 1\n      sessionExpiry: 0s", "  routes:\n", "  delivery: {whenNoSubscriber: hold}\n  routes:\n"}, []diag{{"spec.delivery.whenNoSubscriber", "delivery-hold"}}},
		{"hold core nats", natsIn, []string{"  routes:\n", "  delivery: {whenNoSubscriber: hold}\n  routes:\n"}, []diag{{"spec.delivery.whenNoSubscriber", "delivery-hold"}}},
		{"hold jetstream", natsIn, []string{"    url: nats://127.0.0.1:4222\n", "    url: nats://127.0.0.1:4222\n    nats: {jetstream: {stream: S, durable: d}}\n", "at-most-once, ", "", "  routes:\n", "  delivery: {whenNoSubscriber: hold}\n  routes:\n"}, nil},
		{"hold amqp exclusive queue", amqpIn, []string{"  routes:\n", "  delivery: {whenNoSubscriber: hold}\n  routes:\n"}, []diag{{"spec.delivery.whenNoSubscriber", "delivery-hold"}}},
		{"hold amqp durable queue", amqpIn, []string{"  weida:\n", "    amqp: {queue: {name: q, durable: true, exclusive: false}}\n  weida:\n", "  routes:\n", "  delivery: {whenNoSubscriber: hold}\n  routes:\n"}, nil},
		{"hold outbound", natsOut, []string{"  routes:\n", "  delivery: {whenNoSubscriber: hold}\n  routes:\n"}, []diag{{"spec.delivery", "direction-field"}}},
		{"received mqtt persistent session", mqttIn, []string{"  routes:\n", "  delivery: {acknowledge: received}\n  routes:\n"}, nil},
		{"received and hold", mqttIn, []string{"  routes:\n", "  delivery: {whenNoSubscriber: hold, acknowledge: received}\n  routes:\n"}, nil},
		{"queued mqtt qos 0", mqttIn, []string{"qos: 1", "qos: 0", "delivery-best-effort,", "at-most-once, delivery-best-effort,", "  routes:\n", "  delivery: {acknowledge: queued}\n  routes:\n"}, nil},
		{"received mqtt qos 0", mqttIn, []string{"qos: 1", "qos: 0", "delivery-best-effort,", "at-most-once, delivery-best-effort,", "  routes:\n", "  delivery: {acknowledge: received}\n  routes:\n"}, []diag{{"spec.delivery.acknowledge", "delivery-received"}}},
		{"received mqtt clean start", mqttIn, []string{"qos: 1", "qos: 1\n      cleanStart: true", "  routes:\n", "  delivery: {acknowledge: received}\n  routes:\n"}, []diag{{"spec.delivery.acknowledge", "delivery-received"}}},
		{"received core nats", natsIn, []string{"  routes:\n", "  delivery: {acknowledge: received}\n  routes:\n"}, []diag{{"spec.delivery.acknowledge", "delivery-received"}}},
		{"received jetstream", natsIn, []string{"    url: nats://127.0.0.1:4222\n", "    url: nats://127.0.0.1:4222\n    nats: {jetstream: {stream: S, durable: d}}\n", "at-most-once, ", "", "  routes:\n", "  delivery: {acknowledge: received}\n  routes:\n"}, nil},
		{"received amqp exclusive queue", amqpIn, []string{"  routes:\n", "  delivery: {acknowledge: received}\n  routes:\n"}, []diag{{"spec.delivery.acknowledge", "delivery-received"}}},
		{"received amqp durable queue", amqpIn, []string{"  weida:\n", "    amqp: {queue: {name: q, durable: true, exclusive: false}}\n  weida:\n", "  routes:\n", "  delivery: {acknowledge: received}\n  routes:\n"}, nil},
		{"received outbound", natsOut, []string{"  routes:\n", "  delivery: {acknowledge: received}\n  routes:\n"}, []diag{{"spec.delivery", "direction-field"}}},
		{"acknowledge choice unknown", mqttIn, []string{"  routes:\n", "  delivery: {acknowledge: written}\n  routes:\n"}, []diag{{"spec.delivery.acknowledge", "oneof"}}},
		{"delivery choice unknown", mqttIn, []string{"  routes:\n", "  delivery: {whenNoSubscriber: queue}\n  routes:\n"}, []diag{{"spec.delivery.whenNoSubscriber", "oneof"}}},

		// Limits.
		{"limits", mqttIn, []string{"  routes:\n", "  limits: {maxMessageBytes: 64KiB, bufferBytes: 1048576, inFlight: 10}\n  routes:\n"}, nil},
		{"buffer smaller than a message", mqttIn, []string{"  routes:\n", "  limits: {maxMessageBytes: 2MiB, bufferBytes: 1MiB}\n  routes:\n"}, []diag{{"spec.limits.bufferBytes", "limits-buffer"}}},
		{"max message larger than default buffer", mqttIn, []string{"  routes:\n", "  limits: {maxMessageBytes: 16MiB}\n  routes:\n"}, []diag{{"spec.limits.maxMessageBytes", "limits-buffer"}}},
		{"size unit unknown", mqttIn, []string{"  routes:\n", "  limits: {maxMessageBytes: 1 MB}\n  routes:\n"}, []diag{{"spec.limits.maxMessageBytes", "size"}}},
		{"in flight zero", mqttIn, []string{"  routes:\n", "  limits: {inFlight: 0}\n  routes:\n"}, []diag{{"spec.limits.inFlight", "min"}}},
		{"max message too large", mqttIn, []string{"  routes:\n", "  limits: {maxMessageBytes: 1GiB, bufferBytes: 1GiB}\n  routes:\n"}, []diag{{"spec.limits.maxMessageBytes", "max"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := tt.base
			if len(tt.edits) > 0 {
				doc = edit(t, tt.base, tt.edits...)
			}
			set, err := loadFiles(t, "r.yaml", doc)
			checkWellFormed(t, set)
			got := sortedDiags(diags(Errors(err)))
			want := sortedDiags(tt.want)
			if !slices.Equal(got, want) {
				t.Errorf("diagnostics\n got %q\nwant %q\n%s\n--- resource:\n%s", got, want, dump(set), doc)
			}
		})
	}
}
