package main

import (
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"weida.dev/connector/service"
	"weida.dev/connector/service/placement"
)

// The placement flags: none means no placement, whatever else is set; a
// backend needs what it connects with; the timing's order is checked
// before anything starts.
func TestPlacementFlags(t *testing.T) {
	host := func() (string, error) { return "host-a", nil }
	noHost := func() (string, error) { return "", errors.New("no name") }
	for _, c := range []struct {
		args     []string
		hostname func() (string, error)
		backend  string
		identity string
		err      string
	}{
		{args: nil, hostname: host},
		{args: []string{"--etcd-endpoints", "http://127.0.0.1:2379"}, hostname: host},
		{args: []string{"--placement", "etcd", "--etcd-endpoints", "http://127.0.0.1:2379, http://127.0.0.1:2380"}, hostname: host, backend: "etcd", identity: "host-a"},
		{args: []string{"--placement", "etcd", "--etcd-endpoints", "http://127.0.0.1:2379", "--replica-id", "r1"}, hostname: noHost, backend: "etcd", identity: "r1"},
		{args: []string{"--placement", "kubernetes", "--replica-id", "pod-0"}, hostname: host, backend: "kubernetes", identity: "pod-0"},
		{args: []string{"--placement", "etcd"}, hostname: host, err: "--etcd-endpoints"},
		{args: []string{"--placement", "zookeeper"}, hostname: host, err: "etcd or kubernetes"},
		{args: []string{"--placement", "kubernetes"}, hostname: noHost, err: "--replica-id"},
		{args: []string{"--placement", "kubernetes", "--lease-renew-deadline", "6s"}, hostname: host, err: "renew deadline"},
	} {
		fs := flag.NewFlagSet("run", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		f := addPlacementFlags(fs)
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		p, err := f.placement(c.hostname)
		switch {
		case c.err != "":
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%v: error %v, want one naming %q", c.args, err, c.err)
			}
		case err != nil:
			t.Errorf("%v: %v", c.args, err)
		case p.Backend != c.backend || p.Identity != c.identity:
			t.Errorf("%v: backend %q identity %q, want %q %q", c.args, p.Backend, p.Identity, c.backend, c.identity)
		case c.backend == "etcd" && len(p.EtcdEndpoints) == 0:
			t.Errorf("%v: no endpoints", c.args)
		}
	}
}

// TestResetKeyFlag: --reset-key-file is checked before anything starts,
// and a refusal names the flag, the file and how to make one.
func TestResetKeyFlag(t *testing.T) {
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good"), filepath.Join(dir, "bad")
	if err := os.WriteFile(good, []byte(strings.Repeat("ab", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("REPLACE-ME\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
		err  []string
	}{
		{args: nil},
		{args: []string{"--reset-key-file", good}, want: good},
		{args: []string{"--reset-key-file", bad}, err: []string{"--reset-key-file", bad, "11 bytes", "openssl rand -hex 32"}},
		{args: []string{"--reset-key-file", filepath.Join(dir, "none")}, err: []string{"--reset-key-file", "none"}},
	} {
		fs := flag.NewFlagSet("run", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		f := addPlacementFlags(fs)
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		got, err := f.resetKey()
		if c.err == nil {
			if err != nil || got != c.want {
				t.Errorf("%v: %q, %v; want %q", c.args, got, err, c.want)
			}
			continue
		}
		for _, w := range c.err {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%v: error %v, want one naming %q", c.args, err, w)
			}
		}
	}
}

// TestRunResetKeyFile: `connector run` refuses a placeholder reset key
// before it loads anything, naming the flag, the file and how to make one.
func TestRunResetKeyFile(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "reset-key")
	if err := os.WriteFile(bad, []byte("REPLACE-ME with 64 hex digits"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runCLI(t, "", "run", "-f", "missing.yaml", "--reset-key-file", bad)
	for _, w := range []string{"refusing to start", "--reset-key-file", bad, "29 bytes", "openssl rand -hex 32"} {
		if code != exitUsage || !strings.Contains(errOut, w) {
			t.Errorf("exit %d, %q; want 2 and a refusal naming %q", code, errOut, w)
		}
	}
}

// The drain warning compares --drain with what a resource given up by its
// replica can drain, the renew deadline minus a retry period of the timing
// in force (defaults filled in), and only with placement on.
func TestDrainWarning(t *testing.T) {
	d := placement.DefaultTiming
	usable := d.RenewDeadline - d.RetryPeriod
	etcd := service.Placement{Backend: "etcd"}
	long := service.Placement{Backend: "etcd", Timing: placement.Timing{LeaseDuration: 15 * time.Second, RenewDeadline: 12 * time.Second, RetryPeriod: time.Second}}
	for _, c := range []struct {
		drain time.Duration
		p     service.Placement
		warn  bool
	}{
		{10 * time.Second, service.Placement{}, false}, // no placement: nothing moves
		{10 * time.Second, etcd, true},                 // the default drain against the default timing
		{usable, etcd, false},
		{usable + time.Millisecond, etcd, true},
		{d.Margin(), etcd, false},       // the manifest's 1.5 s
		{10 * time.Second, long, false}, // 11 s usable
		{12 * time.Second, long, true},
	} {
		msg, attrs := drainWarning(c.drain, c.p)
		if (msg != "") != c.warn {
			t.Errorf("drain %v, timing %+v: warning %q, want one: %v", c.drain, c.p.Timing, msg, c.warn)
		}
		if c.warn && (len(attrs) != 4 || attrs[1] != c.drain.String() || !strings.Contains(msg, "renew deadline")) {
			t.Errorf("drain %v: attributes %v, message %q", c.drain, attrs, msg)
		}
	}
}
