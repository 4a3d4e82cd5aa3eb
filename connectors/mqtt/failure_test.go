package mqtt

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/autopaho"

	"weida.dev/connector/connectors"
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

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// passwordBroker starts a private Mosquitto that admits only user with
// password on loopback, and returns its port.
func passwordBroker(t *testing.T, user, password string) int {
	t.Helper()
	for _, bin := range []string{"/usr/sbin/mosquitto", "mosquitto_passwd"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s is not installed", bin)
		}
	}
	dir := t.TempDir()
	pw := filepath.Join(dir, "passwords")
	if out, err := exec.Command("mosquitto_passwd", "-c", "-b", pw, user, password).CombinedOutput(); err != nil {
		t.Fatalf("mosquitto_passwd: %v\n%s", err, out)
	}
	p := freePort(t)
	port := strconv.Itoa(p)
	conf := filepath.Join(dir, "mosquitto.conf")
	err := os.WriteFile(conf, []byte("user root\nlistener "+port+" 127.0.0.1\nallow_anonymous false\npassword_file "+pw+"\n"), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/usr/sbin/mosquitto", "-c", conf)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+port, time.Second)
		if err == nil {
			c.Close()
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("private mosquitto on %s did not start: %v", port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// reasons records the reasons a driver reports.
type reasons struct {
	mu  sync.Mutex
	all []string
}

func (r *reasons) report(s connectors.ConnState) {
	r.mu.Lock()
	r.all = append(r.all, s.Reason)
	r.mu.Unlock()
}

func (r *reasons) has(reason string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, x := range r.all {
		if x == reason {
			return true
		}
	}
	return false
}

// TestWrongPasswordReported: Mosquitto refuses the password in its
// CONNACK; while autopaho retries, the state says CredentialsRefused, and
// Start, when its context ends, returns that reason.
func TestWrongPasswordReported(t *testing.T) {
	port := passwordBroker(t, "bridge", "right")
	backoff := func(int) time.Duration { return 50 * time.Millisecond }
	var srcReasons, sinkReasons reasons
	src, err := NewSource(Config{Host: loopback, Port: port, ClientID: "wrong-pw-in", Username: "bridge", Password: []byte("wrong"), Backoff: backoff}, srcReasons.report)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close(context.Background())
	sink, err := NewSink(Config{Host: loopback, Port: port, ClientID: "wrong-pw-out", Username: "bridge", Password: []byte("wrong"), Backoff: backoff}, sinkReasons.report)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err = src.Start(ctx, []string{"a/b"})
	wantFailure(t, err, "CredentialsRefused")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Start's error does not say its context ended: %v", err)
	}
	sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer scancel()
	wantFailure(t, sink.Start(sctx), "CredentialsRefused")
	if !srcReasons.has("CredentialsRefused") || !sinkReasons.has("CredentialsRefused") {
		t.Errorf("CredentialsRefused not reported: %v / %v", srcReasons.all, sinkReasons.all)
	}

	// The right password connects.
	ok, err := NewSink(Config{Host: loopback, Port: port, ClientID: "right-pw-out", Username: "bridge", Password: []byte("right")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ok.Close(context.Background())
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	if err := ok.Start(ctx2); err != nil {
		t.Fatal(err)
	}
}

// TestUnreachableReported: a refused TCP connection is BrokerUnreachable.
func TestUnreachableReported(t *testing.T) {
	var rs reasons
	sink, err := NewSink(Config{Host: loopback, Port: freePort(t), ClientID: "unreachable",
		Backoff: func(int) time.Duration { return 20 * time.Millisecond }}, rs.report)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	wantFailure(t, sink.Start(ctx), "BrokerUnreachable")
	if !rs.has("BrokerUnreachable") {
		t.Errorf("BrokerUnreachable not reported: %v", rs.all)
	}
}

func TestConnectFailure(t *testing.T) {
	for _, c := range []struct {
		code byte
		want string
	}{{0x86, "CredentialsRefused"}, {0x87, "CredentialsRefused"}, {0x8A, "PermissionDenied"}, {0x88, "BrokerUnreachable"}, {0x85, "ConnectionLost"}} {
		err := &autopahoConnackError{c.code}
		if got := connectFailure(err.wrap()).Reason; got != c.want {
			t.Errorf("CONNACK 0x%02x: %s, want %s", c.code, got, c.want)
		}
	}
}

type autopahoConnackError struct{ code byte }

func (e *autopahoConnackError) wrap() error {
	return fmt.Errorf("connecting: %w", &autopaho.ConnackError{ReasonCode: e.code, Err: errors.New("refused")})
}
