package service_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"weida.dev/connector/service"
)

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func expectChange(t *testing.T, w *service.Watcher, what string) {
	t.Helper()
	select {
	case <-w.Changes():
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no change reported", what)
	}
}

// debounce is long enough that five small writes in a row fall within it
// on a loaded machine (20 ms split a burst in two there, once in ten runs).
const debounce = 250 * time.Millisecond

// expectQuiet: nothing is reported while the debounce passes several times.
func expectQuiet(t *testing.T, w *service.Watcher, what string) {
	t.Helper()
	select {
	case <-w.Changes():
		t.Fatalf("%s: a change was reported", what)
	case <-time.After(4 * debounce):
	}
}

func TestWatcher(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), "# a")
	single := filepath.Join(other, "one.yaml")
	write(t, single, "# one")
	w, err := service.NewWatcher([]string{dir, single}, service.WatchOptions{Debounce: debounce})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	// A burst is one change.
	for i := range 5 {
		write(t, filepath.Join(dir, "a.yaml"), "# a"+string(rune('0'+i)))
	}
	expectChange(t, w, "a burst of writes")
	expectQuiet(t, w, "after the burst")

	// Files the loader does not read are not changes.
	write(t, filepath.Join(dir, ".a.yaml.swp"), "x")
	write(t, filepath.Join(dir, "notes.txt"), "x")
	write(t, filepath.Join(other, "two.yaml"), "x") // not named by the paths
	expectQuiet(t, w, "unrelated files")

	// A file replaced by a rename, a new file in a watched directory.
	write(t, single+".tmp", "# one, again")
	if err := os.Rename(single+".tmp", single); err != nil {
		t.Fatal(err)
	}
	expectChange(t, w, "a file renamed over a watched one")
	write(t, filepath.Join(dir, "b.yml"), "# b")
	expectChange(t, w, "a new file")

	if err := w.Close(); err != nil {
		t.Error(err)
	}
	if err := w.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
}

func TestWatcherMissingPath(t *testing.T) {
	if _, err := service.NewWatcher([]string{filepath.Join(t.TempDir(), "missing")}, service.WatchOptions{}); err == nil {
		t.Error("a missing path can be watched")
	}
}
