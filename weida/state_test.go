package weida

import (
	"crypto/tls"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// freeAddr returns a loopback UDP address nothing listens on right now, for
// tests that must listen twice on the same address.
func freeAddr(t *testing.T) string {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	addr := c.LocalAddr().String()
	_ = c.Close()
	return addr
}

func TestStateFiles(t *testing.T) {
	for _, tc := range []struct{ addr, base string }{
		{"127.0.0.1:7101", "endpoint-127.0.0.1-7101"},
		{"[::1]:7101", "endpoint-__1-7101"},
		{"[fe80::1%eth0]:7101", "endpoint-fe80__1%25eth0-7101"},
		{":7101", "endpoint--7101"},
		{"0.0.0.0:0", "endpoint-0.0.0.0-0"},
		{"Connector-0.Example:7101", "endpoint-connector-0.example-7101"},
		{"host_x:7101", "endpoint-host%5fx-7101"},
		{"host:http-alt", "endpoint-host-http%2dalt"},
	} {
		crt, key, err := StateFiles("/s", tc.addr)
		if err != nil {
			t.Errorf("StateFiles(%q): %v", tc.addr, err)
			continue
		}
		if want := "/s/" + tc.base + ".crt"; crt != want {
			t.Errorf("StateFiles(%q) cert = %s, want %s", tc.addr, crt, want)
		}
		if want := "/s/" + tc.base + ".key"; key != want {
			t.Errorf("StateFiles(%q) key = %s, want %s", tc.addr, key, want)
		}
	}
	if _, _, err := StateFiles("/s", "no-port"); err == nil {
		t.Error("StateFiles accepted an address without a port")
	}
}

func mode(t *testing.T, file string) fs.FileMode {
	t.Helper()
	fi, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

// TestStateDirIdentityStable: two listeners started one after the other on
// one address and StateDir present the same certificate, so a subscriber's
// pin survives the restart; the files are written with private modes.
func TestStateDirIdentityStable(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state") // missing: Listen creates it
	addr := freeAddr(t)
	var logs logBuffer
	a, err := Listen(testCtx(t), addr, ListenConfig{StateDir: dir, Logger: logs.logger()})
	if err != nil {
		t.Fatalf("Listen A: %v", err)
	}
	fp := a.Fingerprint()
	_ = a.Close()
	if !strings.Contains(logs.String(), "generated a new endpoint identity") {
		t.Errorf("the first start did not log the generated identity:\n%s", logs.String())
	}

	b, err := Listen(testCtx(t), addr, ListenConfig{StateDir: dir})
	if err != nil {
		t.Fatalf("Listen B: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	if b.Fingerprint() != fp {
		t.Fatalf("fingerprint changed across restarts: %s, then %s", fp, b.Fingerprint())
	}
	p := publisher(t, b, "/p")
	s, err := Dial(testCtx(t), "weida://"+fp+"@"+addr+"/p", DialConfig{})
	if err != nil {
		t.Fatalf("Dial with the first start's pin: %v", err)
	}
	defer s.Close()
	subscribe(t, b, s, 1, "")
	publish(t, p, "a", []byte("x"))
	if m := receive(t, s); string(m.Payload) != "x" {
		t.Fatalf("received %q", m.Payload)
	}

	crt, key, _ := StateFiles(dir, addr)
	pemCert, err := os.ReadFile(crt)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := FingerprintPEM(pemCert); err != nil || got != fp {
		t.Errorf("FingerprintPEM(%s) = %s, %v; want %s", crt, got, err, fp)
	}
	if m := mode(t, dir); m != 0o700 {
		t.Errorf("state dir mode %v, want 0700", m)
	}
	if m := mode(t, key); m != 0o600 {
		t.Errorf("key mode %v, want 0600", m)
	}
	rk := filepath.Join(dir, ResetKeyFile)
	if m := mode(t, rk); m != 0o600 {
		t.Errorf("reset key mode %v, want 0600", m)
	}
	if b, _ := os.ReadFile(rk); len(b) != 32 {
		t.Errorf("reset key holds %d bytes, want 32", len(b))
	}
	left, _ := filepath.Glob(filepath.Join(dir, ".*tmp*"))
	if len(left) > 0 {
		t.Errorf("temporary files left behind: %v", left)
	}
}

// TestStateDirCertificateFiles: CertFile and KeyFile win over StateDir,
// which then only holds the reset key.
func TestStateDirCertificateFiles(t *testing.T) {
	dir := t.TempDir()
	c := newCert(t, "srv", nil, "127.0.0.1")
	l := listen(t, ListenConfig{CertFile: c.certFile, KeyFile: c.keyFile, StateDir: dir})
	if l.Fingerprint() != Fingerprint(c.cert) {
		t.Fatalf("fingerprint %s, want the CertFile's %s", l.Fingerprint(), Fingerprint(c.cert))
	}
	crt, _, _ := StateFiles(dir, "127.0.0.1:0")
	if _, err := os.Stat(crt); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a state-dir certificate was written although CertFile is set: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, ResetKeyFile)); err != nil {
		t.Errorf("no reset key: %v", err)
	}
}

// TestStateDirDamaged: a damaged identity or reset key fails Listen with
// the file's path and what to do, never a silently new identity; a key
// whose certificate is missing gets a new certificate with the same
// fingerprint.
func TestStateDirDamaged(t *testing.T) {
	const addr = "127.0.0.1:0"
	fresh := func(t *testing.T) (dir, crt, key, fp string) {
		dir = t.TempDir()
		l, err := Listen(testCtx(t), addr, ListenConfig{StateDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		fp = l.Fingerprint()
		_ = l.Close()
		crt, key, _ = StateFiles(dir, addr)
		return dir, crt, key, fp
	}
	mustFail := func(t *testing.T, dir string, wants ...string) {
		t.Helper()
		l, err := Listen(testCtx(t), addr, ListenConfig{StateDir: dir})
		if err == nil {
			_ = l.Close()
			t.Fatal("Listen succeeded")
		}
		for _, w := range wants {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q does not say %q", err, w)
			}
		}
	}
	t.Run("corrupt certificate", func(t *testing.T) {
		dir, crt, key, _ := fresh(t)
		if err := os.WriteFile(crt, []byte("not a certificate\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		mustFail(t, dir, crt, key, "delete both", "pin the new fingerprint")
		if b, _ := os.ReadFile(crt); string(b) != "not a certificate\n" {
			t.Error("the damaged certificate was replaced")
		}
	})
	t.Run("corrupt key", func(t *testing.T) {
		dir, crt, key, _ := fresh(t)
		if err := os.WriteFile(key, []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		mustFail(t, dir, crt, key)
	})
	t.Run("key of another identity", func(t *testing.T) {
		dir, _, key, _ := fresh(t)
		_, other, _, err := GenerateIdentity()
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(key, other, 0o600); err != nil {
			t.Fatal(err)
		}
		mustFail(t, dir, key)
	})
	t.Run("certificate without key", func(t *testing.T) {
		dir, crt, key, _ := fresh(t)
		if err := os.Remove(key); err != nil {
			t.Fatal(err)
		}
		mustFail(t, dir, crt, key, "restore the key")
	})
	t.Run("unreadable key", func(t *testing.T) {
		if os.Geteuid() == 0 {
			t.Skip("root reads any file")
		}
		dir, _, key, _ := fresh(t)
		if err := os.Chmod(key, 0); err != nil {
			t.Fatal(err)
		}
		mustFail(t, dir, key)
	})
	t.Run("key without certificate", func(t *testing.T) {
		dir, crt, _, fp := fresh(t)
		if err := os.Remove(crt); err != nil {
			t.Fatal(err)
		}
		l, err := Listen(testCtx(t), addr, ListenConfig{StateDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if l.Fingerprint() != fp {
			t.Fatalf("fingerprint %s after re-creating the certificate, want %s", l.Fingerprint(), fp)
		}
		if _, err := os.Stat(crt); err != nil {
			t.Fatalf("certificate not written again: %v", err)
		}
	})
	t.Run("short reset key", func(t *testing.T) {
		dir, _, _, _ := fresh(t)
		rk := filepath.Join(dir, ResetKeyFile)
		if err := os.WriteFile(rk, []byte("short"), 0o600); err != nil {
			t.Fatal(err)
		}
		mustFail(t, dir, rk, "delete it")
	})
	t.Run("state dir is a file", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "f")
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		mustFail(t, f, f)
	})
}

// TestGenerateIdentity: the generated pair loads as a TLS key pair, its
// fingerprint is the one FingerprintPEM and a listener using the files
// report, and FingerprintPEM refuses what holds no certificate.
func TestGenerateIdentity(t *testing.T) {
	certPEM, keyPEM, fp, err := GenerateIdentity()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		t.Fatalf("the generated pair does not load: %v", err)
	}
	if got, err := FingerprintPEM(append(append([]byte{}, keyPEM...), certPEM...)); err != nil || got != fp {
		t.Fatalf("FingerprintPEM = %s, %v; want %s", got, err, fp)
	}
	dir := t.TempDir()
	crt, key := filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem")
	if err := os.WriteFile(crt, certPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if l := listen(t, ListenConfig{CertFile: crt, KeyFile: key}); l.Fingerprint() != fp {
		t.Fatalf("listener fingerprint %s, want %s", l.Fingerprint(), fp)
	}
	for _, bad := range [][]byte{nil, []byte("junk"), keyPEM, []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")} {
		if _, err := FingerprintPEM(bad); err == nil {
			t.Errorf("FingerprintPEM(%.20q) succeeded", bad)
		}
	}
}
