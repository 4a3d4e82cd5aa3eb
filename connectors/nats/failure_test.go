package nats

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"weida.dev/connector/connectors"
	"weida.dev/connector/connectors/conntest"
)

// wantFailure checks that err is a retryable *connectors.Failure for reason.
func wantFailure(t *testing.T, err error, reason string) {
	t.Helper()
	var f *connectors.Failure
	if !errors.As(err, &f) {
		t.Fatalf("error %v (%T) is not a *connectors.Failure; want %s", err, err, reason)
	}
	if f.Reason != reason || f.Permanent {
		t.Fatalf("failure %s (permanent %v): %v; want retryable %s", f.Reason, f.Permanent, err, reason)
	}
}

// tokenServer starts a private nats-server that accepts only token.
func tokenServer(t *testing.T, token string) *privateServer {
	t.Helper()
	return startPrivateServer(t, "-c", tokenConf(t, token))
}

func tokenConf(t *testing.T, token string) string {
	t.Helper()
	conf := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(conf, []byte("authorization { token: \""+token+"\" }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return conf
}

// TestStartCredentialsRefused: a wrong token ends Start with
// CredentialsRefused, for a Source and a Sink, without the token in the
// error.
func TestStartCredentialsRefused(t *testing.T) {
	srv := tokenServer(t, "x")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := Config{Host: loopback, Port: srv.Port(), Token: "wrong-token", Backoff: func(int) time.Duration { return 20 * time.Millisecond }}
	var st states
	src, err := NewSource(cfg, st.report)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close(context.Background())
	err = src.Start(ctx, []string{"a"})
	wantFailure(t, err, "CredentialsRefused")
	if !st.seen("CredentialsRefused") {
		t.Errorf("CredentialsRefused was not reported: %+v", st.all)
	}
	sink, err := NewSink(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close(context.Background())
	wantFailure(t, sink.Start(ctx), "CredentialsRefused")
}

// TestCredentialsRefusedOnReconnect: when the server comes back refusing
// the credentials that worked before, nats.go gives up after two refusals
// and Read and Write end with CredentialsRefused rather than a bare close.
func TestCredentialsRefusedOnReconnect(t *testing.T) {
	srv := tokenServer(t, "x")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := Config{Host: loopback, Port: srv.Port(), Token: "x", Backoff: func(int) time.Duration { return 20 * time.Millisecond }}
	src, err := NewSource(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close(context.Background())
	if err := src.Start(ctx, []string{"a"}); err != nil {
		t.Fatal(err)
	}
	sink, err := NewSink(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close(context.Background())
	if err := sink.Start(ctx); err != nil {
		t.Fatal(err)
	}
	srv.kill()
	srv.args = []string{"-c", tokenConf(t, "rotated")}
	srv.start()
	_, _, err = src.Read(ctx)
	wantFailure(t, err, "CredentialsRefused")
	eventually(t, 20*time.Second, "Write to fail for good", func() bool {
		err = sink.Write(ctx, &connectors.Message{Topic: "a"})
		return !errors.Is(err, connectors.ErrNotConnected)
	})
	wantFailure(t, err, "CredentialsRefused")
	wantFailure(t, writeAsync(ctx, sink, &connectors.Message{Topic: "a"}), "CredentialsRefused")
}

// TestStartStreamMissing: a JetStream resource naming a stream that does
// not exist fails Start with StreamMissing, inbound and outbound.
func TestStartStreamMissing(t *testing.T) {
	requireServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	missing := "MISSING_" + conntest.Unique()
	src, err := NewSource(Config{Host: loopback, Port: serverPort, JetStream: &JetStream{Stream: missing, Durable: "d"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close(context.Background())
	wantFailure(t, src.Start(ctx, []string{"a.>"}), "StreamMissing")
	sink, err := NewSink(Config{Host: loopback, Port: serverPort, JetStream: &JetStream{Stream: missing}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close(context.Background())
	wantFailure(t, sink.Start(ctx), "StreamMissing")
}

// TestConsumerDeleted: when the durable consumer is deleted under a
// running Source, Read ends with ConsumerMissing and keeps saying so; a new
// Source creates the consumer again and reads what the stream holds.
func TestConsumerDeleted(t *testing.T) {
	requireServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stream, prefix := newStream(t)
	cfg := Config{Host: loopback, Port: serverPort, JetStream: &JetStream{Stream: stream, Durable: "d-" + conntest.Unique()}}
	filters := []string{prefix + ".>"}
	src, err := NewSource(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close(context.Background())
	if err := src.Start(ctx, filters); err != nil {
		t.Fatal(err)
	}
	nc := dial(t)
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, prefix+".one", []byte("one")); err != nil {
		t.Fatal(err)
	}
	m, _, err := src.Read(ctx)
	if err != nil || string(m.Payload) != "one" {
		t.Fatalf("Read = %v, %v", m, err)
	}
	// Not acknowledged: the stream keeps it for the next consumer.
	if err := js.DeleteConsumer(ctx, stream, cfg.JetStream.Durable); err != nil {
		t.Fatal(err)
	}
	_, _, err = src.Read(ctx)
	wantFailure(t, err, "ConsumerMissing")
	_, _, err = src.Read(ctx)
	wantFailure(t, err, "ConsumerMissing")
	if err := src.Close(ctx); err != nil {
		t.Fatal(err)
	}

	next, err := NewSource(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close(context.Background())
	if err := next.Start(ctx, filters); err != nil {
		t.Fatal(err)
	}
	m, ack, err := next.Read(ctx)
	if err != nil || string(m.Payload) != "one" {
		t.Fatalf("Read from the new consumer = %v, %v", m, err)
	}
	ack(nil)
}
