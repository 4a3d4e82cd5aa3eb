package nats

import (
	"bytes"
	"context"
	"crypto/tls"
	"log/slog"
	"strings"
	"testing"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"pgregory.net/rapid"

	"weida.dev/connector/connectors"
	"weida.dev/connector/resources"
)

func userSeed(t *testing.T) string {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	return string(seed)
}

func TestConfigValidate(t *testing.T) {
	seed := userSeed(t)
	tests := []struct {
		name    string
		cfg     Config
		inbound bool
		wantErr string // substring; "" means valid
	}{
		{"plain", Config{Host: "127.0.0.1", Port: 4222}, true, ""},
		{"tls", Config{Host: "broker.example", Port: 4222, TLS: &tls.Config{}}, false, ""},
		{"default port", Config{Host: "::1"}, true, ""},
		{"no host", Config{}, true, "host is required"},
		{"port too large", Config{Host: "a", Port: 65536}, true, "out of range"},
		{"negative port", Config{Host: "a", Port: -1}, true, "out of range"},
		{"user password", Config{Host: "a", User: "u", Password: "p"}, true, ""},
		{"token", Config{Host: "a", Token: "t"}, true, ""},
		{"nkey", Config{Host: "a", NKeySeed: seed}, true, ""},
		{"creds", Config{Host: "a", Creds: []byte("jwt and seed")}, true, ""},
		{"two methods", Config{Host: "a", User: "u", Token: "t"}, true, "more than one authentication method"},
		{"password and creds", Config{Host: "a", Password: "p", Creds: []byte("x")}, true, "more than one authentication method"},
		{"bad nkey", Config{Host: "a", NKeySeed: "SUnotaseed"}, true, "nkey seed"},
		{"js inbound", Config{Host: "a", JetStream: &JetStream{Stream: "S", Durable: "d"}}, true, ""},
		{"js outbound", Config{Host: "a", JetStream: &JetStream{Stream: "S"}}, false, ""},
		{"js no stream", Config{Host: "a", JetStream: &JetStream{Durable: "d"}}, true, "stream name is required"},
		{"js inbound no durable", Config{Host: "a", JetStream: &JetStream{Stream: "S"}}, true, "durable consumer name"},
		{"js dotted stream", Config{Host: "a", JetStream: &JetStream{Stream: "a.b", Durable: "d"}}, true, "must not contain"},
		{"js wildcard durable", Config{Host: "a", JetStream: &JetStream{Stream: "S", Durable: "d*"}}, true, "must not contain"},
		{"js space durable", Config{Host: "a", JetStream: &JetStream{Stream: "S", Durable: "d d"}}, true, "must not contain"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.validate(tc.inbound)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("validate = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestConstructorsValidate(t *testing.T) {
	if _, err := NewSource(Config{Host: "a", JetStream: &JetStream{Stream: "S"}}, func(connectors.ConnState) {}); err == nil {
		t.Error("NewSource accepted JetStream without a durable")
	}
	if _, err := NewSink(Config{}, func(connectors.ConnState) {}); err == nil {
		t.Error("NewSink accepted a Config without a host")
	}
}

// TestConfigLogValueRedacts: logging a Config never prints a secret.
func TestConfigLogValueRedacts(t *testing.T) {
	seed := userSeed(t)
	for _, cfg := range []Config{
		{Host: "a", User: "alice", Password: "hunter2-secret"},
		{Host: "a", Token: "hunter2-secret"},
		{Host: "a", NKeySeed: seed},
		{Host: "a", Creds: []byte("hunter2-secret")},
	} {
		var buf bytes.Buffer
		slog.New(slog.NewTextHandler(&buf, nil)).Info("config", "nats", cfg)
		out := buf.String()
		if strings.Contains(out, "hunter2-secret") || strings.Contains(out, seed) {
			t.Errorf("log leaks a secret: %s", out)
		}
		if !strings.Contains(out, "auth=") {
			t.Errorf("log does not name the auth method: %s", out)
		}
	}
}

func TestAuthOptions(t *testing.T) {
	seed := userSeed(t)
	kp, _ := nkeys.FromSeed([]byte(seed))
	pub, _ := kp.PublicKey()
	tests := []struct {
		name  string
		cfg   Config
		check func(o *natsgo.Options) bool
	}{
		{"user", Config{Host: "a", User: "u", Password: "p"}, func(o *natsgo.Options) bool { return o.User == "u" && o.Password == "p" }},
		{"token", Config{Host: "a", Token: "tok"}, func(o *natsgo.Options) bool { return o.Token == "tok" }},
		{"nkey", Config{Host: "a", NKeySeed: seed}, func(o *natsgo.Options) bool { return o.Nkey == pub && o.SignatureCB != nil }},
		{"creds", Config{Host: "a", Creds: []byte("x")}, func(o *natsgo.Options) bool { return o.UserJWT != nil }},
		{"tls", Config{Host: "a", TLS: &tls.Config{}}, func(o *natsgo.Options) bool { return o.Secure && o.TLSConfig != nil }},
		{"none", Config{Host: "a"}, func(o *natsgo.Options) bool {
			return o.User == "" && o.Token == "" && o.Nkey == "" && o.UserJWT == nil && !o.Secure
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts, err := tc.cfg.options(func(connectors.ConnState) {}, slog.New(slog.DiscardHandler), newTracker(), nil)
			if err != nil {
				t.Fatal(err)
			}
			o := natsgo.GetDefaultOptions()
			for _, opt := range opts {
				if err := opt(&o); err != nil {
					t.Fatal(err)
				}
			}
			if !tc.check(&o) {
				t.Fatalf("options do not carry the %s method: %+v", tc.name, o)
			}
			if o.MaxReconnect != -1 || !o.RetryOnFailedConnect {
				t.Fatalf("not reconnecting forever: MaxReconnect %d RetryOnFailedConnect %v", o.MaxReconnect, o.RetryOnFailedConnect)
			}
		})
	}
}

func TestReadHeaders(t *testing.T) {
	tests := []struct {
		name string
		h    natsgo.Header
		want headers
	}{
		{"nil", nil, headers{}},
		{"exact", natsgo.Header{"Content-Type": {"a/b"}, "traceparent": {"tp"}, "tracestate": {"ts"}, "x-weida-connector": {"m"}},
			headers{"a/b", "tp", "ts", "m"}},
		{"other spelling", natsgo.Header{"content-type": {"a/b"}, "Traceparent": {"tp"}, "TRACESTATE": {"ts"}, "X-Weida-Connector": {"m"}},
			headers{"a/b", "tp", "ts", "m"}},
		{"exact wins", natsgo.Header{"Content-Type": {"exact"}, "content-type": {"other"}}, headers{contentType: "exact"}},
		{"first value", natsgo.Header{"Content-Type": {"one", "two"}}, headers{contentType: "one"}},
		{"empty values", natsgo.Header{"content-type": {}}, headers{}},
		{"unrelated", natsgo.Header{"Nats-Msg-Id": {"1"}}, headers{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := readHeaders(tc.h); got != tc.want {
				t.Fatalf("readHeaders = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestLoopMarker(t *testing.T) {
	m := &connectors.Message{Topic: "a.b", Payload: []byte("x")}
	out := fromMessage(m, "inst-1")
	if got := toMessage(out.Subject, out.Data, out.Header, "inst-1"); !got.Looped {
		t.Error("a message marked by this instance is not flagged looped")
	}
	if got := toMessage(out.Subject, out.Data, out.Header, "inst-2"); got.Looped {
		t.Error("another instance's marker is flagged looped")
	}
	if got := toMessage(out.Subject, out.Data, out.Header, ""); got.Looped {
		t.Error("a Source without a marker flags messages looped")
	}
	if fromMessage(m, "").Header != nil {
		t.Error("a message without metadata or marker carries headers")
	}
}

// TestHeadersRoundTrip: what a Sink writes, a Source reads back unchanged.
func TestHeadersRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := &connectors.Message{
			Topic:       rapid.StringMatching(`[a-z]{1,8}(\.[a-z]{1,8}){0,3}`).Draw(t, "topic"),
			Payload:     rapid.SliceOf(rapid.Byte()).Draw(t, "payload"),
			ContentType: rapid.StringMatching(`([a-z]+/[a-z+.-]+)?`).Draw(t, "ct"),
			Traceparent: rapid.StringMatching(`(00-[0-9a-f]{32}-[0-9a-f]{16}-0[01])?`).Draw(t, "tp"),
			Tracestate:  rapid.StringMatching(`([a-z]{1,8}=[a-z0-9]{1,8}(,[a-z]{1,8}=[a-z0-9]{1,8}){0,2})?`).Draw(t, "ts"),
		}
		marker := rapid.StringMatching(`([a-z0-9-]{1,12})?`).Draw(t, "marker")
		out := fromMessage(m, marker)
		got := toMessage(out.Subject, out.Data, out.Header, marker)
		if got.Topic != m.Topic || !bytes.Equal(got.Payload, m.Payload) || got.ContentType != m.ContentType ||
			got.Traceparent != m.Traceparent || got.Tracestate != m.Tracestate || got.Looped != (marker != "") {
			t.Fatalf("round trip changed the message: %+v -> %+v", m, got)
		}
	})
}

func TestVersionAtLeast(t *testing.T) {
	tests := []struct {
		v    string
		want bool
	}{
		{"2.9.10", false}, {"2.10.0", true}, {"2.10.0-beta.1", true}, {"2.11.3", true}, {"3.0.0", true},
		{"1.99.0", false}, {"v2.10.1", true}, {"", true}, {"garbage", true}, {"2.x.1", true},
	}
	for _, tc := range tests {
		if got := versionAtLeast(tc.v, 2, 10); got != tc.want {
			t.Errorf("versionAtLeast(%q, 2, 10) = %v, want %v", tc.v, got, tc.want)
		}
	}
}

func TestSameFilters(t *testing.T) {
	tests := []struct {
		cc      jetstream.ConsumerConfig
		filters []string
		want    bool
	}{
		{jetstream.ConsumerConfig{FilterSubject: "a.*"}, []string{"a.*"}, true},
		{jetstream.ConsumerConfig{FilterSubjects: []string{"b", "a"}}, []string{"a", "b"}, true},
		{jetstream.ConsumerConfig{FilterSubject: "a.*"}, []string{"a.b"}, false},
		{jetstream.ConsumerConfig{}, []string{"a"}, false},
		{jetstream.ConsumerConfig{FilterSubjects: []string{"a"}}, []string{"a", "b"}, false},
	}
	for _, tc := range tests {
		if got := sameFilters(tc.cc, tc.filters); got != tc.want {
			t.Errorf("sameFilters(%+v, %v) = %v, want %v", tc.cc, tc.filters, got, tc.want)
		}
	}
	var cc jetstream.ConsumerConfig
	setFilters(&cc, []string{"one"})
	if cc.FilterSubject != "one" || cc.FilterSubjects != nil {
		t.Errorf("one filter: %+v", cc)
	}
	setFilters(&cc, []string{"one", "two"})
	if cc.FilterSubject != "" || len(cc.FilterSubjects) != 2 {
		t.Errorf("two filters: %+v", cc)
	}
}

// TestStartCanceled: Start gives up when its context ends while the server
// is unreachable, and Close still cleans up.
func TestStartCanceled(t *testing.T) {
	port := freePort(t)
	src, err := NewSource(Config{Host: loopback, Port: portNumber(t, port)}, func(connectors.ConnState) {})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := src.Start(ctx, []string{"a"}); err == nil {
		t.Fatal("Start succeeded with no server")
	}
	if err := src.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	sink, err := NewSink(Config{Host: loopback, Port: portNumber(t, port)}, func(connectors.ConnState) {})
	if err != nil {
		t.Fatal(err)
	}
	if err := sink.Start(ctx); err == nil {
		t.Fatal("Sink Start succeeded with no server")
	}
	if err := sink.Write(context.Background(), &connectors.Message{Topic: "a"}); err == nil {
		t.Fatal("Write succeeded on a Sink that never connected")
	}
	if err := sink.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestServerURL: the URL nats.go is given, and logs show, is built from
// the parsed address, with the scheme and default port of the driver's
// URL rules.
func TestServerURL(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Host: "127.0.0.1", Port: 4223}, "nats://127.0.0.1:4223"},
		{Config{Host: "broker.example"}, "nats://broker.example:4222"},
		{Config{Host: "::1", TLS: &tls.Config{}}, "tls://[::1]:4222"},
	} {
		if got := tc.cfg.serverURL(); got != tc.want {
			t.Errorf("%s:%d TLS %v: %s, want %s", tc.cfg.Host, tc.cfg.Port, tc.cfg.TLS != nil, got, tc.want)
		}
	}
}

// TestConfigOfAddress: the driver takes the server's address from the
// loaded resource's parsed fields.
func TestConfigOfAddress(t *testing.T) {
	built := &tls.Config{ServerName: "nats.example"}
	for _, tc := range []struct {
		name    string
		broker  resources.Broker
		tls     *tls.Config
		wantTLS bool
	}{
		{"plain", resources.Broker{Host: "127.0.0.1", Port: 4222}, nil, false},
		{"tls", resources.Broker{Host: "nats.example", Port: 4443, TLS: resources.TLS{Enabled: true}}, built, true},
		{"tls without a built config", resources.Broker{Host: "fe80::1", Port: 4222, TLS: resources.TLS{Enabled: true}}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := configOf(resources.BrokerConfig{Resource: &resources.Connector{Broker: tc.broker}, TLS: tc.tls, Logger: slog.New(slog.DiscardHandler)})
			if cfg.Host != tc.broker.Host || cfg.Port != tc.broker.Port {
				t.Errorf("address %s:%d, want %s:%d", cfg.Host, cfg.Port, tc.broker.Host, tc.broker.Port)
			}
			if (cfg.TLS != nil) != tc.wantTLS {
				t.Errorf("TLS %v, want TLS %v", cfg.TLS, tc.wantTLS)
			}
			if tc.tls != nil && cfg.TLS != tc.tls {
				t.Error("the TLS configuration built for the resource is not the one used")
			}
		})
	}
}
