package resources_test

import (
	"testing"

	"weida.dev/connector/resources"
)

// TestRevision: moving a resource within its file keeps its revision, as
// it keeps it Equal; changing its configuration changes the revision.
func TestRevision(t *testing.T) {
	load := func(doc string) *resources.Connector {
		t.Helper()
		set, err := loadFiles(t, "r.yaml", doc)
		if err != nil {
			t.Fatal(err)
		}
		return set.Connectors()[0]
	}
	base := load(mqttIn)
	moved := load("# a comment moves every line down\n\n" + mqttIn)
	if base.Source == moved.Source {
		t.Fatal("the resource did not move")
	}
	if !base.Equal(moved) || base.Revision() != moved.Revision() {
		t.Errorf("a moved resource: Equal %v, revisions %s and %s", base.Equal(moved), base.Revision(), moved.Revision())
	}
	for _, changed := range []string{
		edit(t, mqttIn, "url: mqtt://127.0.0.1:1883", "url: mqtt://127.0.0.1:1884"),
		edit(t, mqttIn, "127.0.0.1:7001/sensors", "127.0.0.1:7001/other"),
		edit(t, mqttIn, "sensors/+/temperature", "sensors/+/humidity"),
	} {
		c := load(changed)
		if c.Revision() == base.Revision() || c.Equal(base) {
			t.Errorf("a changed resource kept its revision:\n%s", changed)
		}
	}
	if len(base.Revision()) != 64 {
		t.Errorf("revision %q is not a sha256 digest", base.Revision())
	}
}
