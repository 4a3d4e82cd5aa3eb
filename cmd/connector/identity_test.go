package main

import (
	"context"
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"weida.dev/connector/weida"
)

// TestIdentityCreateShow: create writes a loadable pair, prints its
// fingerprint, and refuses to replace files without --force; show prints
// the same fingerprint; a listener using the files presents it, and a
// subscriber pinning it connects.
func TestIdentityCreateShow(t *testing.T) {
	dir := t.TempDir()
	crt, key := filepath.Join(dir, "endpoint.crt"), filepath.Join(dir, "endpoint.key")
	code, out, errOut := runCLI(t, "", "identity", "create", "--cert", crt, "--key", key)
	if code != exitOK || errOut != "" {
		t.Fatalf("create: exit %d, stderr %q", code, errOut)
	}
	fp := strings.TrimSpace(out)
	if !strings.HasPrefix(fp, "sha256:") || len(fp) != len("sha256:")+64 {
		t.Fatalf("create printed %q, want a fingerprint", out)
	}
	if _, err := tls.LoadX509KeyPair(crt, key); err != nil {
		t.Fatalf("the written pair does not load: %v", err)
	}
	if fi, err := os.Stat(key); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, %v; want mode 0600", fi.Mode(), err)
	}

	code, out, _ = runCLI(t, "", "identity", "show", crt)
	if code != exitOK || strings.TrimSpace(out) != fp {
		t.Fatalf("show: exit %d, out %q, want %s", code, out, fp)
	}

	before, _ := os.ReadFile(crt)
	code, _, errOut = runCLI(t, "", "identity", "create", "--cert", crt, "--key", filepath.Join(dir, "other.key"))
	if code != exitFailure || !strings.Contains(errOut, crt) || !strings.Contains(errOut, "--force") {
		t.Fatalf("create over an existing certificate: exit %d, stderr %q", code, errOut)
	}
	if _, err := os.Stat(filepath.Join(dir, "other.key")); err == nil {
		t.Fatal("a refused create wrote the key anyway")
	}
	if after, _ := os.ReadFile(crt); string(after) != string(before) {
		t.Fatal("a refused create changed the certificate")
	}

	code, out, _ = runCLI(t, "", "identity", "create", "--force", "--cert", crt, "--key", key)
	fp2 := strings.TrimSpace(out)
	if code != exitOK || fp2 == fp {
		t.Fatalf("create --force: exit %d, fingerprint %s (old %s)", code, fp2, fp)
	}
	if _, err := tls.LoadX509KeyPair(crt, key); err != nil {
		t.Fatalf("the replaced pair does not load: %v", err)
	}

	// The files serve: a listener presents the printed fingerprint.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := weida.Listen(ctx, "127.0.0.1:0", weida.ListenConfig{CertFile: crt, KeyFile: key})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.Fingerprint() != fp2 {
		t.Fatalf("listener fingerprint %s, want %s", l.Fingerprint(), fp2)
	}
	if _, err := l.Publisher("/p"); err != nil {
		t.Fatal(err)
	}
	s, err := weida.Dial(ctx, "weida://"+fp2+"@"+l.Addr().(*net.UDPAddr).String()+"/p", weida.DialConfig{})
	if err != nil {
		t.Fatalf("dialling with the printed pin: %v", err)
	}
	_ = s.Close()
}

func TestIdentityShowSeveral(t *testing.T) {
	dir := t.TempDir()
	var fps []string
	var files []string
	for _, n := range []string{"a", "b"} {
		crt := filepath.Join(dir, n+".crt")
		code, out, _ := runCLI(t, "", "identity", "create", "--cert", crt, "--key", filepath.Join(dir, n+".key"))
		if code != exitOK {
			t.Fatalf("create %s: exit %d", n, code)
		}
		fps = append(fps, strings.TrimSpace(out))
		files = append(files, crt)
	}
	code, out, _ := runCLI(t, "", append([]string{"identity", "show"}, files...)...)
	want := fps[0] + "  " + files[0] + "\n" + fps[1] + "  " + files[1] + "\n"
	if code != exitOK || out != want {
		t.Fatalf("show two files: exit %d, out %q, want %q", code, out, want)
	}
}

func TestIdentityErrors(t *testing.T) {
	dir := t.TempDir()
	keyOnly := filepath.Join(dir, "k.pem")
	if code, _, _ := runCLI(t, "", "identity", "create", "--cert", filepath.Join(dir, "c.pem"), "--key", keyOnly); code != exitOK {
		t.Fatalf("create: exit %d", code)
	}
	junk := filepath.Join(dir, "junk")
	if err := os.WriteFile(junk, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"identity"}, exitUsage, "missing subcommand"},
		{[]string{"identity", "rotate"}, exitUsage, "unknown subcommand"},
		{[]string{"identity", "create"}, exitUsage, "--cert and --key are required"},
		{[]string{"identity", "create", "--cert", "x"}, exitUsage, "--cert and --key are required"},
		{[]string{"identity", "create", "--cert", "x", "--key", "./x"}, exitUsage, "different files"},
		{[]string{"identity", "create", "--cert", "x", "--key", "y", "extra"}, exitUsage, "unexpected argument"},
		{[]string{"identity", "create", "--cert", filepath.Join(dir, "no", "c"), "--key", filepath.Join(dir, "no", "k")}, exitFailure, "no such file"},
		{[]string{"identity", "show"}, exitUsage, "at least one"},
		{[]string{"identity", "show", filepath.Join(dir, "missing.pem")}, exitFailure, "missing.pem"},
		{[]string{"identity", "show", keyOnly}, exitFailure, keyOnly},
		{[]string{"identity", "show", junk}, exitFailure, "no PEM CERTIFICATE"},
	} {
		code, _, errOut := runCLI(t, "", tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.says) {
			t.Errorf("%q: exit %d, stderr %q; want exit %d saying %q", tc.args, code, errOut, tc.code, tc.says)
		}
	}
}

// TestIdentityHelpOnce holds the identity commands to what TestHelpOnce
// asks of every command.
func TestIdentityHelpOnce(t *testing.T) {
	for _, args := range [][]string{{"identity"}, {"identity", "create"}, {"identity", "show"}} {
		code, out, errOut := runCLI(t, "", append(args, "--help")...)
		if code != 0 || strings.Count(out, "usage:") != 1 || errOut != "" {
			t.Errorf("%q --help: code %d, %d usages on stdout, stderr %q", args, code, strings.Count(out, "usage:"), errOut)
		}
		code, _, errOut = runCLI(t, "", append(args, "--no-such-flag")...)
		if code != exitUsage || !strings.Contains(errOut, "no-such-flag") || strings.Count(errOut, "usage:") != 1 {
			t.Errorf("%q --no-such-flag: code %d, stderr %q", args, code, errOut)
		}
	}
}
