package resources_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"testing/fstest"
	"time"

	"weida.dev/connector/internal/safefile"
)

// within fails the test when f does not return within a few seconds: the
// bugs these tests guard against block forever.
func within[T any](t *testing.T, what string, f func() T) T {
	t.Helper()
	done := make(chan T, 1)
	go func() { done <- f() }()
	select {
	case v := <-done:
		return v
	case <-time.After(5 * time.Second):
		t.Fatalf("%s blocked", what)
		panic("unreachable")
	}
}

func mkfifo(t *testing.T, path string) {
	t.Helper()
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestNonRegularResourceFiles: a pipe or a device named with -f, or
// sitting in a directory that is read, is refused at once with the path
// and what it is, and the regular files next to it still load.
func TestNonRegularResourceFiles(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(mqttIn), 0o600); err != nil {
		t.Fatal(err)
	}
	mkfifo(t, filepath.Join(dir, "b.yaml"))
	type result struct {
		set *Set
		err error
	}
	for _, paths := range [][]string{{filepath.Join(dir, "b.yaml")}, {dir}, {"/dev/zero"}} {
		r := within(t, "Load "+paths[0], func() result { s, err := Loader{}.Load(paths...); return result{s, err} })
		errs := Errors(r.err)
		if len(errs) != 1 || errs[0].Rule != "file-not-regular" || errs[0].Line != 0 {
			t.Fatalf("Load(%q): %v", paths, r.err)
		}
		want := "is a named pipe (FIFO), not a regular file"
		if paths[0] == "/dev/zero" {
			want = "is a character device, not a regular file"
		}
		if e := errs[0]; !strings.HasSuffix(e.File, "b.yaml") && e.File != "/dev/zero" || !strings.Contains(e.Message, want) || e.Hint == "" {
			t.Errorf("Load(%q): %+v", paths, e)
		}
		if got := names(r.set); paths[0] == dir && !slices.Equal(got, []string{"mqtt-in", ""}) {
			t.Errorf("Load(%q) documents %q", paths, got)
		}
	}

	// Through an fs.FS too: the type is checked before opening.
	fsys := fstest.MapFS{"conf/p.yaml": {Mode: fs.ModeNamedPipe}, "conf/ok.yaml": {Data: []byte(natsIn)}}
	_, err := Loader{FS: fsys}.Load("conf")
	if got := diags(Errors(err)); !slices.Equal(got, []diag{{"", "file-not-regular"}}) {
		t.Errorf("MapFS: %v", got)
	}
}

// TestSecretFileNotRegular: a secret file that is a pipe or a device is
// refused at once, and one larger than MaxSecretBytes too.
func TestSecretFileNotRegular(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "password")
	mkfifo(t, fifo)
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, make([]byte, MaxSecretBytes+1), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ file, want string }{
		{fifo, fifo + " is a named pipe (FIFO), not a regular file"},
		{"/dev/zero", "/dev/zero is a character device, not a regular file"},
		{big, big + " is larger than 1048576 bytes"},
	} {
		err := within(t, "Resolve "+c.file, func() error { _, err := Resolver{}.Resolve(SecretRef{File: c.file}); return err })
		if !errors.Is(err, ErrSecret) || !safefile.Refused(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Resolve(%s) = %v", c.file, err)
		}
	}
	// An injected reader is held to the same cap.
	r := Resolver{ReadFile: func(string) ([]byte, error) { return make([]byte, MaxSecretBytes+1), nil }}
	var tl *safefile.TooLargeError
	if _, err := r.Resolve(SecretRef{File: "x"}); !errors.As(err, &tl) {
		t.Errorf("injected reader, oversized: %v", err)
	}
}

// TestFilterNotUTF8: a filter holding a byte that is not UTF-8 is refused
// on the route, for every protocol, and the resource does not run. The
// YAML lexer would otherwise read the byte as U+FFFD and subscribe to a
// filter nobody wrote. A stray byte elsewhere (a comment) is refused too,
// where it is.
func TestFilterNotUTF8(t *testing.T) {
	for _, c := range []struct{ name, base, old, new string }{
		{"mqtt", mqttIn, "sensors/+/temperature", "sensors/\xff/temperature"},
		{"nats", natsIn, "orders.*.created", "orders.\xfe.created"},
		{"amqp", amqpIn, "audit.events.#", "audit.\xc3(.#"},
		{"mqtt-out", mqttOut, "filter: orders/+/created", "filter: \"orders/+/cr\xe9ated\""},
	} {
		t.Run(c.name, func(t *testing.T) {
			set, err := loadFiles(t, "r.yaml", edit(t, c.base, c.old, c.new))
			errs := Errors(err)
			if got := diags(errs); !slices.Equal(got, []diag{{"spec.routes[0].filter", "invalid-utf8"}}) {
				t.Fatalf("diagnostics %v", got)
			}
			if errs[0].Line == 0 || errs[0].Column == 0 || errs[0].Hint == "" || len(set.Connectors()) != 0 {
				t.Errorf("error %+v", errs[0])
			}
		})
	}
	_, err := loadFiles(t, "r.yaml", "# caf\xe9\n"+mqttIn)
	if errs := Errors(err); len(errs) != 1 || errs[0].Field != "" || errs[0].Rule != "invalid-utf8" || errs[0].Line != 1 || errs[0].Column != 6 {
		t.Errorf("a comment: %v", err)
	}
	// U+FFFD written as UTF-8 is text like any other.
	if _, err := loadFiles(t, "r.yaml", edit(t, natsIn, "orders.*.created", "orders.\uFFFD.created")); err != nil {
		t.Errorf("U+FFFD: %v", err)
	}
}
