package main

import (
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// systemStateDir is the state directory of a connector installed as a
// system service (and of the container image, which declares it a volume).
const systemStateDir = "/var/lib/weida-connector"

// defaultStateDir chooses `connector run`'s state directory when
// --state-dir is not given, and says why:
//
//  1. $STATE_DIRECTORY, which systemd sets for a unit with StateDirectory=
//     (the first entry when the unit names several);
//  2. /var/lib/weida-connector, when this process may write there (or may
//     create it);
//  3. $XDG_STATE_HOME/weida-connector, else ~/.local/state/weida-connector,
//     for a connector started by hand;
//  4. none: endpoint identities are then generated at every start.
//
// getenv and writable are the process environment and an access check;
// tests inject both.
func defaultStateDir(getenv func(string) string, writable func(string) bool) (dir, source string) {
	if v := getenv("STATE_DIRECTORY"); v != "" {
		first, _, _ := strings.Cut(v, ":")
		return first, "$STATE_DIRECTORY"
	}
	if writable(systemStateDir) {
		return systemStateDir, "default"
	}
	if v := getenv("XDG_STATE_HOME"); filepath.IsAbs(v) {
		return filepath.Join(v, "weida-connector"), "$XDG_STATE_HOME"
	}
	if v := getenv("HOME"); filepath.IsAbs(v) {
		return filepath.Join(v, ".local", "state", "weida-connector"), "$HOME"
	}
	return "", "none"
}

// writableDir reports whether dir exists as a directory this process may
// create files in, or does not exist and its parent is such a directory.
func writableDir(dir string) bool {
	if fi, err := os.Stat(dir); err == nil {
		return fi.IsDir() && unix.Access(dir, unix.W_OK|unix.X_OK) == nil
	} else if !os.IsNotExist(err) {
		return false
	}
	parent := filepath.Dir(dir)
	fi, err := os.Stat(parent)
	return err == nil && fi.IsDir() && unix.Access(parent, unix.W_OK|unix.X_OK) == nil
}
