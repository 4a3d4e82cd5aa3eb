package nats

import (
	"context"
	"net"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"weida.dev/connector/connectors"
)

// TestJetStreamExpiry runs a real nats-server in the test process (the
// library's, a version with per-message TTLs; the loopback server may be
// older) and checks that the Source says when the stream ends each message:
// its MaxAge, or its Nats-TTL when the stream allows TTLs and it is sooner,
// both for the last values read at start and for messages Read delivers.
func TestJetStreamExpiry(t *testing.T) {
	srv, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	nc, err := natsgo.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const maxAge = time.Hour
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "TTL", Subjects: []string{"ttl.>"}, MaxAge: maxAge, AllowMsgTTL: true}); err != nil {
		t.Fatal(err)
	}
	publish := func(subject, ttl string) {
		m := natsgo.NewMsg(subject)
		m.Data = []byte("v")
		if ttl != "" {
			m.Header.Set(TTLHeader, ttl)
		}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	publish("ttl.short", "30s")
	publish("ttl.plain", "")
	publish("ttl.never", "never")

	src, err := NewSource(Config{Host: "127.0.0.1", Port: srv.Addr().(*net.TCPAddr).Port,
		Name: "ttl", JetStream: &JetStream{Stream: "TTL", Durable: "ttl"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close(context.Background()) })
	if err := src.Start(ctx, []string{"ttl.*"}); err != nil {
		t.Fatal(err)
	}
	life := func(m *connectors.Message) time.Duration {
		if m.SourceUnixNano == 0 || m.ExpiresUnixNano == 0 {
			t.Fatalf("%s: stored at %d, expires %d; want both", m.Topic, m.SourceUnixNano, m.ExpiresUnixNano)
		}
		return time.Duration(m.ExpiresUnixNano - m.SourceUnixNano)
	}
	want := map[string]time.Duration{"ttl.short": 30 * time.Second, "ttl.plain": maxAge, "ttl.never": maxAge}
	seen := 0
	if err := src.LastValues(ctx, []string{"ttl.*"}, func(m *connectors.Message) {
		seen++
		if got := life(m); got != want[m.Topic] {
			t.Errorf("last value %s lives %v, want %v", m.Topic, got, want[m.Topic])
		}
	}); err != nil {
		t.Fatal(err)
	}
	if seen != len(want) {
		t.Fatalf("%d last values, want %d", seen, len(want))
	}
	for range want {
		m, ack, err := src.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ack(nil)
		if got := life(m); got != want[m.Topic] {
			t.Errorf("read %s lives %v, want %v", m.Topic, got, want[m.Topic])
		}
	}
}
