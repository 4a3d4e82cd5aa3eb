package main

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"

	"weida.dev/connector/service"
)

func TestVersionLine(t *testing.T) {
	vcs := []debug.BuildSetting{
		{Key: "vcs", Value: "git"},
		{Key: "vcs.revision", Value: "0123abcd"},
		{Key: "vcs.time", Value: "2026-01-02T03:04:05Z"},
		{Key: "vcs.modified", Value: "true"},
	}
	for _, tc := range []struct {
		name, linked string
		bi           *debug.BuildInfo
		want         string
	}{
		{"go install", "", &debug.BuildInfo{Main: debug.Module{Path: "weida.dev/connector", Version: "v1.4.0"}},
			"connector v1.4.0"},
		{"local build", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs},
			"connector (devel) vcs.revision=0123abcd vcs.modified=true"},
		{"linked wins", "v2.0.0-rc.1", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs},
			"connector v2.0.0-rc.1 vcs.revision=0123abcd vcs.modified=true"},
		{"linked, no build info", "v2.0.0", nil, "connector v2.0.0"},
		{"nothing known", "", nil, "connector (unknown)"},
	} {
		if got := versionLine(tc.linked, tc.bi); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestBuildOf: the build the admin listener exports is the one `connector
// version` prints.
func TestBuildOf(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123abcd"}, {Key: "vcs.modified", Value: "false"},
	}}
	for _, tc := range []struct {
		linked string
		bi     *debug.BuildInfo
		want   service.Build
	}{
		{"", bi, service.Build{Version: "(devel)", Revision: "0123abcd", GoVersion: "go1.26.8"}},
		{"v2.0.0", bi, service.Build{Version: "v2.0.0", Revision: "0123abcd", GoVersion: "go1.26.8"}},
		{"", nil, service.Build{Version: "(unknown)"}},
	} {
		got := buildOf(tc.linked, tc.bi)
		if got != tc.want {
			t.Errorf("buildOf(%q) = %+v, want %+v", tc.linked, got, tc.want)
		}
		if line := versionLine(tc.linked, tc.bi); !strings.HasPrefix(line, "connector "+got.Version) ||
			(got.Revision != "" && !strings.Contains(line, "vcs.revision="+got.Revision)) {
			t.Errorf("versionLine %q disagrees with buildOf %+v", line, got)
		}
	}
}

// TestVersionOfBinary builds the command as a user would and runs it. A
// build from this checkout prints exactly what the go command recorded in
// the binary: the module version, a pseudo-version made from the commit
// since Go 1.24 or "(devel)" when no VCS data was recorded (in a linked git
// worktree, golang/go#58218, or with -buildvcs=false), then the revision
// and modified flag when recorded. A version set with -ldflags -X takes
// the place of the module version.
func TestVersionOfBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to build with")
	}
	dir := t.TempDir()
	build := func(name string, extra ...string) string {
		t.Helper()
		bin := filepath.Join(dir, name)
		args := append(append([]string{"build", "-o", bin}, extra...), ".")
		if out, err := exec.Command(goBin, args...).CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return bin
	}
	runBin := func(name string, args ...string) string {
		t.Helper()
		out, err := exec.Command(name, args...).Output()
		if err != nil {
			t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(out))
	}

	local := build("connector")
	recorded := runBin(goBin, "version", "-m", local)
	m := regexp.MustCompile(`(?m)^\tmod\tweida\.dev/connector\t(\S+)`).FindStringSubmatch(recorded)
	if m == nil {
		t.Fatalf("go version -m records no main module:\n%s", recorded)
	}
	if !strings.HasPrefix(m[1], "v") && m[1] != "(devel)" {
		t.Errorf("module version %q is neither (devel) nor a pseudo-version", m[1])
	}
	moduleVersion := m[1]
	want := "connector " + moduleVersion
	for _, key := range []string{"vcs.revision", "vcs.modified"} {
		if m := regexp.MustCompile(`(?m)^\tbuild\t` + regexp.QuoteMeta(key) + `=(\S+)$`).FindStringSubmatch(recorded); m != nil {
			want += " " + key + "=" + m[1]
		}
	}
	if got := runBin(local, "version"); got != want {
		t.Errorf("local build prints %q, want %q", got, want)
	}
	if got := runBin(local, "--version"); got != want {
		t.Errorf("--version prints %q, want %q", got, want)
	}

	linked := build("connector-linked", "-ldflags", "-X main.version=v9.8.7-test")
	if got, want := runBin(linked, "version"), strings.Replace(want, moduleVersion, "v9.8.7-test", 1); got != want {
		t.Errorf("build with -X main.version prints %q, want %q", got, want)
	}
}

// TestVersionHint: only a build that names neither a version nor a
// revision gets the explanation, and it says how to get one.
func TestVersionHint(t *testing.T) {
	devel := &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}
	withRev := &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123abcd"}}}
	released := &debug.BuildInfo{Main: debug.Module{Version: "v1.4.0"}}
	if h := versionHint("", devel); !strings.Contains(h, "-buildvcs=true") || !strings.Contains(h, "make build") {
		t.Errorf("hint for a devel build without revision: %q", h)
	}
	for name, tc := range map[string]struct {
		linked string
		bi     *debug.BuildInfo
	}{"revision": {"", withRev}, "released": {"", released}, "linked": {"v2.0.0", devel}, "no build info": {"", nil}} {
		if h := versionHint(tc.linked, tc.bi); h != "" {
			t.Errorf("%s: unexpected hint %q", name, h)
		}
	}
}
