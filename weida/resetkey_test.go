package weida

import (
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
)

// testResetKey is the key the reset key file tests write, in both forms.
var testResetKey = [32]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32}

func writeFile(t *testing.T, name string, b []byte) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(f, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestResetKeyFileFormats: the two forms the usual tools produce are read
// as the same key; everything else is refused with a *ResetKeyError that
// names the file, its size and the rule, and says how to make one.
func TestResetKeyFileFormats(t *testing.T) {
	h := hex.EncodeToString(testResetKey[:])
	for name, content := range map[string]string{
		"raw":            string(testResetKey[:]),
		"hex":            h,
		"hex newline":    h + "\n",
		"hex CRLF":       h + "\r\n",
		"upper-case hex": strings.ToUpper(h) + "\n",
	} {
		f := writeFile(t, "reset.key", []byte(content))
		k, err := fileResetKey(f)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if err := CheckResetKeyFile(f); err != nil {
			t.Errorf("%s: CheckResetKeyFile: %v", name, err)
		}
		want := quic.StatelessResetKey(testResetKey)
		if *k != want {
			t.Errorf("%s: key %x, want %x", name, k[:], want[:])
		}
	}

	for name, tc := range map[string]struct{ content, rule string }{
		"placeholder":       {"REPLACE-ME\n", "neither 32 bytes nor 64 hex digits"},
		"empty":             {"", "neither 32 bytes nor 64 hex digits"},
		"raw and a newline": {string(testResetKey[:]) + "\n", "neither 32 bytes nor 64 hex digits"},
		"two newlines":      {h + "\n\n", "neither 32 bytes nor 64 hex digits"},
		"hex too short":     {h[:62] + "\n", "neither 32 bytes nor 64 hex digits"},
		"base64":            {"AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=\n", "neither 32 bytes nor 64 hex digits"},
		"not hex":           {"zz" + h[2:], "not all are hex digits"},
		"zeros":             {string(make([]byte, 32)), "all zeros"},
		"hex zeros":         {strings.Repeat("0", 64), "all zeros"},
		"32 newlines":       {strings.Repeat("\n", 32), "printable text"},
		"a phrase":          {"correct horse battery staple 123", "printable text"},
		"16 bytes as hex":   {h[:32], "printable text"}, // openssl rand -hex 16, newline stripped
	} {
		f := writeFile(t, "reset.key", []byte(tc.content))
		err := CheckResetKeyFile(f)
		var re *ResetKeyError
		if !errors.As(err, &re) {
			t.Errorf("%s: %v, want a *ResetKeyError", name, err)
			continue
		}
		if re.File != f || re.Size != len(tc.content) || !strings.Contains(re.Rule, tc.rule) {
			t.Errorf("%s: %+v, want file %s, size %d, a rule with %q", name, re, f, len(tc.content), tc.rule)
		}
		if msg := err.Error(); !strings.Contains(msg, f) || !strings.Contains(msg, "openssl rand -hex 32") {
			t.Errorf("%s: %q names neither the file nor how to make one", name, msg)
		}
	}

	missing := filepath.Join(t.TempDir(), "none")
	if err := CheckResetKeyFile(missing); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Errorf("a missing file: %v, want fs.ErrNotExist naming %s", err, missing)
	}
	if _, err := Listen(testCtx(t), "127.0.0.1:0", ListenConfig{ResetKeyFile: missing}); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Listen with a missing reset key file: %v, want fs.ErrNotExist", err)
	}
}

// TestResetKeyFileOverStateDir: the file's key is the listener's, and the
// state directory then holds no reset key of its own.
func TestResetKeyFileOverStateDir(t *testing.T) {
	dir := t.TempDir()
	f := writeFile(t, "reset.key", []byte(hex.EncodeToString(testResetKey[:])+"\n"))
	l := listen(t, ListenConfig{StateDir: dir, ResetKeyFile: f})
	if got := *l.tr.StatelessResetKey; got != quic.StatelessResetKey(testResetKey) {
		t.Errorf("listener reset key %x, want the file's %x", got[:], testResetKey[:])
	}
	if _, err := os.Stat(filepath.Join(dir, ResetKeyFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a reset key was written to the state dir although ResetKeyFile is set: %v", err)
	}
}

// TestResetKeyFileSharedByReplicas: two replicas, each with a state
// directory of its own, read one reset key file. The first dies without
// closing its connections and the second takes its address over (as a
// Service does once the lease has moved): it answers the old connection's
// packets with a stateless reset, so the subscriber learns at once that
// its connection is gone rather than by its idle timeout.
func TestResetKeyFileSharedByReplicas(t *testing.T) {
	t.Parallel()
	f := writeFile(t, "reset.key", testResetKey[:])
	addr := freeAddr(t)
	a, err := Listen(testCtx(t), addr, ListenConfig{StateDir: t.TempDir(), ResetKeyFile: f})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	publisher(t, a, "/moved")
	busy := dial(t, a, "/moved", DialConfig{})
	subscribe(t, a, busy, 1, "a")

	_ = a.udp.Close() // replica A is gone: no CONNECTION_CLOSE leaves
	b, err := Listen(testCtx(t), addr, ListenConfig{StateDir: t.TempDir(), ResetKeyFile: f})
	if err != nil {
		t.Fatalf("Listen on replica B: %v", err)
	}
	defer b.Close()
	moved := time.Now()
	// Large enough to be answered with a reset (see testStatelessReset).
	_ = busy.Subscribe(testCtx(t), "some.longer.filter.to.make.the.packet.large")
	select {
	case <-busy.Done():
	case <-time.After(lostWithin):
		t.Fatalf("subscriber still connected %v after replica B took the address", lostWithin)
	}
	var reset *quic.StatelessResetError
	if err := busy.Err(); !errors.As(err, &reset) {
		t.Errorf("subscriber: %v after %v, want a stateless reset", err, time.Since(moved).Round(time.Millisecond))
	}
}
