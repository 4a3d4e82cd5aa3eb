package resources_test

import (
	"fmt"
	"log/slog"
	"os"
	"testing/fstest"
	"weida.dev/connector/cmd/drivers"
	"weida.dev/connector/service"

	"weida.dev/connector/resources"
)

const example = `apiVersion: connector.weida.dev/v1alpha1
kind: Connector
metadata:
  name: orders-in
spec:
  protocol: nats
  direction: inbound
  broker:
    url: nats://127.0.0.1:4222
    credentials: {token: {env: NATS_TOKEN}}
  weida:
    listen: weida://127.0.0.1:7002/orders
  conversion:
    losses: [at-most-once, delivery-best-effort, non-utf8-names, ordering, properties, reply-to, topic-length]
  routes:
    - name: created
      filter: orders.*.created
    - filter: orders.>
`

func ExampleLoader_Load() {
	fsys := fstest.MapFS{"orders.yaml": {Data: []byte(example)}}
	// The protocols a program speaks are its drivers' (see package service).
	loader := resources.Loader{FS: fsys, Protocols: service.Protocols(drivers.All())}
	set, err := loader.Load("orders.yaml")
	for _, e := range resources.Errors(err) {
		fmt.Printf("%s %s %s\n", e.Position, e.Field, e.Rule)
	}

	// Without the refused route, the resource is valid.
	fsys["orders.yaml"].Data = []byte(example[:len(example)-len("    - filter: orders.>\n")])
	set, err = loader.Load("orders.yaml")
	if err != nil {
		panic(err)
	}
	c := set.Connectors()[0]
	fmt.Println(c.Name, c.Policy.Name(), c.Weida.Endpoint.Path, c.Broker.Credentials.Secret("token"))
	for _, r := range c.Routes {
		fmt.Printf("%s: %s → %s\n", r.Name, r.Foreign, r.Weida)
	}
	// Output:
	// orders.yaml:18:15 spec.routes[1].filter nats-one-or-more
	// orders-in nats-tokens/v1 /orders env NATS_TOKEN
	// created: orders.*.created → orders.*.created
}

func ExampleResolver() {
	r := resources.Resolver{LookupEnv: func(name string) (string, bool) {
		return "s3cr3t", name == "NATS_TOKEN"
	}}
	token, err := r.Resolve(resources.SecretRef{Env: "NATS_TOKEN"})
	if err != nil {
		panic(err)
	}
	fmt.Println(token, len(token.Reveal()))

	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
	logger.Info("connecting", "token", token)

	_, err = r.Resolve(resources.SecretRef{Env: "MISSING"})
	fmt.Println(err)
	// Output:
	// [redacted] 6
	// level=INFO msg=connecting token=[redacted]
	// resources: secret unavailable: environment variable MISSING is not set
}
