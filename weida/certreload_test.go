package weida

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// copyOver writes the content of src to dst by a rename over it, as a
// Kubernetes Secret update or cert-manager does.
func copyOver(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		t.Fatal(err)
	}
}

// pollFor polls cond every 50 ms (each look may dial) until it holds,
// failing after testTimeout.
func pollFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestListenerReloadsCertificateFiles: a listener with CertFile and
// KeyFile serves what the files hold now: once they are replaced, new
// connections get the new certificate (a dial pinned to it succeeds, one
// pinned to the old key is refused) and Fingerprint reports it, while a
// connection made before keeps working. Files that cannot be loaded (a
// damaged certificate) are logged, and the last good certificate is
// served on.
func TestListenerReloadsCertificateFiles(t *testing.T) {
	one := newCert(t, "one", nil, "127.0.0.1")
	two := newCert(t, "two", nil, "127.0.0.1")
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	copyOver(t, one.certFile, certFile)
	copyOver(t, one.keyFile, keyFile)
	var logs logBuffer
	l := listen(t, ListenConfig{CertFile: certFile, KeyFile: keyFile, Logger: logs.logger()})
	publisher(t, l, "/r")
	fp1, fp2 := Fingerprint(one.cert), Fingerprint(two.cert)
	if l.Fingerprint() != fp1 {
		t.Fatalf("fingerprint %s, want the first certificate's %s", l.Fingerprint(), fp1)
	}
	before := dial(t, l, "/r", DialConfig{})
	urlFor := func(fp string) string { return fmt.Sprintf("weida://%s@%s/r", fp, l.Addr()) }

	copyOver(t, two.keyFile, keyFile)
	copyOver(t, two.certFile, certFile)
	pollFor(t, "a dial pinned to the new certificate to succeed", func() bool {
		s, err := Dial(testCtx(t), urlFor(fp2), DialConfig{})
		if err != nil {
			return false
		}
		_ = s.Close()
		return true
	})
	if got := l.Fingerprint(); got != fp2 {
		t.Errorf("Fingerprint() = %s after the reload, want %s", got, fp2)
	}
	if s, err := Dial(testCtx(t), urlFor(fp1), DialConfig{}); err == nil {
		_ = s.Close()
		t.Error("a dial pinned to the replaced certificate succeeded")
	} else if !errors.Is(err, ErrFingerprintMismatch) {
		t.Errorf("a dial pinned to the replaced certificate: %v, want ErrFingerprintMismatch", err)
	}
	if err := before.Subscribe(testCtx(t), "x.#"); err != nil {
		t.Errorf("the connection made before the reload no longer works: %v", err)
	}
	if !strings.Contains(logs.String(), "reloaded the endpoint's certificate") {
		t.Errorf("the reload is not logged:\n%s", logs.String())
	}

	if err := os.WriteFile(certFile, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pollFor(t, "the damaged file to be logged", func() bool {
		l.Fingerprint() // looks at the files, at most once per CertCheckInterval
		return strings.Contains(logs.String(), "cannot be loaded")
	})
	s, err := Dial(testCtx(t), urlFor(fp2), DialConfig{})
	if err != nil {
		t.Fatalf("after a damaged certificate file, a dial pinned to the last good one: %v", err)
	}
	_ = s.Close()
}
