package safefile_test

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"weida.dev/connector/internal/safefile"
)

func TestReadFileRegular(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := safefile.ReadFile(p, 5)
	if err != nil || string(b) != "hello" {
		t.Fatalf("ReadFile = %q, %v", b, err)
	}
	var tl *safefile.TooLargeError
	if _, err := safefile.ReadFile(p, 4); !errors.As(err, &tl) || tl.Limit != 4 || tl.Path != p {
		t.Errorf("over the limit: %v", err)
	}
	if _, err := safefile.ReadFile(filepath.Join(t.TempDir(), "missing"), 4); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

// TestNotRegular: each kind of file that could block or never end is
// refused at once, with a message naming the path and the kind.
func TestNotRegular(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	link := filepath.Join(dir, "link")
	if err := os.Symlink(fifo, link); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, kind string }{
		{fifo, "a named pipe (FIFO)"},
		{link, "a named pipe (FIFO)"}, // links are followed
		{sock, "a socket"},
		{"/dev/zero", "a character device"},
		{dir, "a directory"},
	} {
		done := make(chan error, 1)
		go func() { _, err := safefile.ReadFile(c.path, 1<<20); done <- err }()
		select {
		case err := <-done:
			var nr *safefile.NotRegularError
			if !errors.As(err, &nr) || nr.Path != c.path || !strings.Contains(err.Error(), c.kind) || !safefile.Refused(err) {
				t.Errorf("%s: %v", c.path, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: ReadFile blocked", c.path)
		}
	}
}
