package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestDefaultStateDir(t *testing.T) {
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	yes := func(string) bool { return true }
	no := func(string) bool { return false }
	for _, c := range []struct {
		getenv           func(string) string
		writable         func(string) bool
		wantDir, wantSrc string
	}{
		{env("STATE_DIRECTORY", "/run/a:/run/b", "HOME", "/home/u"), yes, "/run/a", "$STATE_DIRECTORY"},
		{env("HOME", "/home/u"), yes, systemStateDir, "default"},
		{env("HOME", "/home/u", "XDG_STATE_HOME", "/x/state"), no, "/x/state/weida-connector", "$XDG_STATE_HOME"},
		{env("HOME", "/home/u", "XDG_STATE_HOME", "relative"), no, "/home/u/.local/state/weida-connector", "$HOME"},
		{env(), no, "", "none"},
	} {
		dir, src := defaultStateDir(c.getenv, c.writable)
		if dir != c.wantDir || src != c.wantSrc {
			t.Errorf("defaultStateDir = %q, %q; want %q, %q", dir, src, c.wantDir, c.wantSrc)
		}
	}
}

func TestWritableDir(t *testing.T) {
	dir := t.TempDir()
	if !writableDir(dir) || !writableDir(filepath.Join(dir, "new")) || writableDir(filepath.Join(dir, "new", "deeper")) {
		t.Error("a writable directory, or a missing one in it, is writable; one two levels down is not")
	}
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if writableDir(file) {
		t.Error("a file is not a writable directory")
	}
	if os.Geteuid() != 0 {
		ro := filepath.Join(dir, "ro")
		if err := os.Mkdir(ro, 0o500); err != nil {
			t.Fatal(err)
		}
		if writableDir(ro) || writableDir(filepath.Join(ro, "x")) {
			t.Error("a read-only directory is writable")
		}
	}
}
