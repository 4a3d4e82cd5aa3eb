package resources_test

import (
	"flag"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"weida.dev/connector/policy"
)

var update = flag.Bool("update", false, "rewrite examples/invalid/*.golden from the loader's diagnostics")

// repoFS is the repository root, so that file names read as a user at the
// root would type them.
var repoFS = os.DirFS("..")

func TestExamplesValid(t *testing.T) {
	set, err := Loader{FS: repoFS}.Load("examples")
	if err != nil {
		t.Fatalf("examples/ must be valid:\n%v", err)
	}
	checkWellFormed(t, set)
	seen := map[string]bool{}
	ports := map[int]string{}
	for _, d := range set.Documents {
		if len(d.Warnings) > 0 {
			t.Errorf("%s: warnings %v", d.Name, d.Warnings)
		}
		c := d.Connector
		seen[string(c.Protocol)+" "+string(c.Direction)] = true
		if c.Direction == policy.Inbound {
			if other, dup := ports[c.Weida.Endpoint.Port]; dup {
				t.Errorf("%s and %s share port %d", c.Name, other, c.Weida.Endpoint.Port)
			}
			ports[c.Weida.Endpoint.Port] = c.Name
		}
		if c.Weida.Endpoint.Host != "127.0.0.1" || c.Broker.Host != "127.0.0.1" {
			t.Errorf("%s: examples stay on 127.0.0.1", c.Name)
		}
		for _, f := range []string{c.Weida.CertFile, c.Weida.KeyFile, c.Weida.CAFile} {
			if f == "" {
				continue
			}
			if _, err := os.Stat(filepath.Join("..", f)); err != nil {
				t.Errorf("%s refers to a missing file: %v", c.Name, err)
			}
		}
	}
	if len(seen) != 6 {
		t.Errorf("examples cover %d protocol/direction pairs, want all 6: %v", len(seen), seen)
	}
}

// TestInvalidExamples compares each examples/invalid/*.yaml's diagnostics
// (position, field, rule) with its .golden file. Run with -update to
// rewrite the golden files after a deliberate change.
func TestInvalidExamples(t *testing.T) {
	files, err := filepath.Glob("../examples/invalid/*.yaml")
	if err != nil || len(files) < 10 {
		t.Fatalf("invalid examples: %v %v", files, err)
	}
	for _, f := range files {
		name := "examples/invalid/" + filepath.Base(f)
		t.Run(filepath.Base(f), func(t *testing.T) {
			set, err := Loader{FS: repoFS}.Load(name)
			if err == nil {
				t.Fatal("the example is valid")
			}
			checkWellFormed(t, set)
			// The golden files hold positions and rules; a mount's
			// diagnostics must also say what to write instead.
			for _, e := range Errors(err) {
				if strings.HasPrefix(e.Rule, "mount-") && e.Hint == "" {
					t.Errorf("%s %s %s has no hint", e.Position, e.Field, e.Rule)
				}
			}
			got := goldenText(name, Errors(err))
			golden := strings.TrimSuffix(f, ".yaml") + ".golden"
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./resources -run TestInvalidExamples -update)", err)
			}
			if got != string(want) {
				t.Errorf("diagnostics differ from %s\n--- got\n%s--- want\n%s", path.Base(golden), got, want)
			}
		})
	}
}

func goldenText(name string, errs []*FieldError) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Diagnostics of `connector check -f %s`: position, field, rule.\n", name)
	b.WriteString("# Regenerate after a deliberate change: go test ./resources -run TestInvalidExamples -update\n")
	for _, e := range errs {
		field := e.Field
		if field == "" {
			field = "-"
		}
		fmt.Fprintf(&b, "%s %s %s\n", e.Position, field, e.Rule)
	}
	return b.String()
}
