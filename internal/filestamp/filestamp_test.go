package filestamp_test

import (
	"os"
	"path/filepath"
	"testing"

	"weida.dev/connector/internal/filestamp"
)

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestStampChanges: every way a secret file is replaced changes its stamp;
// reading it again without a change does not.
func TestStampChanges(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "secret")
	write(t, p, "one")
	before := filestamp.Of(p)
	if before.Missing || before.Size != 3 {
		t.Fatalf("stamp of a written file: %+v", before)
	}
	if again := filestamp.Of(p); again != before {
		t.Fatalf("stamp changed without a write: %+v then %+v", before, again)
	}

	// A rename over the file (an atomic update) gives it a new inode.
	tmp := filepath.Join(dir, "secret.tmp")
	write(t, tmp, "two")
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
	renamed := filestamp.Of(p)
	if renamed == before {
		t.Errorf("a rename over the file left its stamp %+v", renamed)
	}

	// An overwrite in place with another size.
	write(t, p, "three")
	if filestamp.Of(p) == renamed {
		t.Error("an overwrite with another size left the stamp")
	}

	// A symbolic link swapped to another target, as a Kubernetes Secret
	// volume's ..data is.
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	if err := os.Mkdir(a, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(b, 0o700); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(a, "token"), "tok")
	write(t, filepath.Join(b, "token"), "tok")
	link := filepath.Join(dir, "data")
	if err := os.Symlink(a, link); err != nil {
		t.Fatal(err)
	}
	viaLink := filepath.Join(link, "token")
	first := filestamp.All([]string{viaLink})
	if err := os.Symlink(b, link+".new"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(link+".new", link); err != nil {
		t.Fatal(err)
	}
	if filestamp.All([]string{viaLink}).Equal(first) {
		t.Error("swapping the directory link left the stamp of the file under it")
	}

	// Removal, and a file that never existed.
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if s := filestamp.Of(p); !s.Missing {
		t.Errorf("stamp of a removed file: %+v", s)
	}
	if filestamp.All(nil) != nil || !filestamp.All(nil).Equal(filestamp.Set{}) {
		t.Error("the stamps of no file are not empty")
	}
}
