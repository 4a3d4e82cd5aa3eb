package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/goccy/go-yaml"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

// TestSchemaUpToDate keeps the committed schema equal to what `connector
// schema` prints, so that editors validate with the loader's rules.
func TestSchemaUpToDate(t *testing.T) {
	chdirRoot(t)
	code, out, errOut := runCLI(t, "", "schema")
	if code != exitOK {
		t.Fatalf("schema: exit %d\n%s", code, errOut)
	}
	committed, err := os.ReadFile(schemaFile)
	if err != nil {
		t.Fatalf("%v\nrefresh it with: go run ./cmd/connector schema > %s", err, schemaFile)
	}
	if string(committed) == out {
		return
	}
	got, want := strings.Split(out, "\n"), strings.Split(string(committed), "\n")
	line := 0
	for line < len(got) && line < len(want) && got[line] == want[line] {
		line++
	}
	hint := func(ls []string) string {
		if line < len(ls) {
			return strings.TrimSpace(ls[line])
		}
		return "(end of file)"
	}
	t.Errorf("%s is out of date with the resource definitions: first difference at line %d: generated %q, committed %q\n"+
		"refresh it with: go run ./cmd/connector schema > %s", schemaFile, line+1, hint(got), hint(want), schemaFile)
}

// compileSchema compiles the committed schema.
func compileSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	f, err := os.Open(schemaFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	doc, err := jsonschema.UnmarshalJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource(schemaFile, doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile(schemaFile)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// documents reads a YAML file's documents as JSON values, which is how an
// editor's YAML language server hands them to the schema.
func documents(t *testing.T, file string) []any {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var out []any
	for {
		var v any
		err := dec.Decode(&v)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		j, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(j))
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		out = append(out, inst)
	}
}

// TestSchemaValidatesExamples: every example the loader accepts, the
// schema accepts, and every example names the schema for editors.
func TestSchemaValidatesExamples(t *testing.T) {
	chdirRoot(t)
	s := compileSchema(t)
	files, _ := filepath.Glob("examples/*.yaml")
	if len(files) < 6 {
		t.Fatalf("%d examples", len(files))
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			b, _ := os.ReadFile(f)
			if want := "# yaml-language-server: $schema=../" + schemaFile + "\n"; !strings.HasPrefix(string(b), want) {
				t.Errorf("does not start with %q", want)
			}
			docs := documents(t, f)
			if len(docs) == 0 {
				t.Fatal("no documents")
			}
			for i, d := range docs {
				if err := s.Validate(d); err != nil {
					t.Errorf("document %d: %v", i+1, err)
				}
			}
		})
	}
}

// TestSchemaRefusesStructuralMistakes: the invalid examples whose mistake
// is one of structure fail the schema as they fail the loader, and a few
// more made here.
func TestSchemaRefusesStructuralMistakes(t *testing.T) {
	chdirRoot(t)
	s := compileSchema(t)
	for _, f := range []string{
		"examples/invalid/unknown-field.yaml",
		"examples/invalid/mqtt-qos2.yaml",
	} {
		for i, d := range documents(t, f) {
			if err := s.Validate(d); err == nil {
				t.Errorf("%s document %d: the schema accepts it", f, i+1)
			}
		}
	}
	valid := documents(t, "examples/mqtt-inbound.yaml")[0]
	for name, change := range map[string]func(spec map[string]any){
		"missing routes":       func(s map[string]any) { delete(s, "routes") },
		"missing broker url":   func(s map[string]any) { delete(s["broker"].(map[string]any), "url") },
		"route without filter": func(s map[string]any) { s["routes"] = []any{map[string]any{"name": "x"}} },
		"other protocol block": func(s map[string]any) { s["broker"].(map[string]any)["nats"] = map[string]any{} },
		"wrong scheme":         func(s map[string]any) { s["broker"].(map[string]any)["url"] = "nats://127.0.0.1:4222" },
		"unknown direction":    func(s map[string]any) { s["direction"] = "sideways" },
		"unknown loss":         func(s map[string]any) { s["conversion"].(map[string]any)["losses"] = []any{"retian"} },
		"another protocol's policy": func(s map[string]any) {
			s["conversion"].(map[string]any)["policy"] = "nats-tokens/v1"
		},
		"inline password": func(s map[string]any) {
			s["broker"].(map[string]any)["credentials"] = map[string]any{"username": "u", "password": "hunter2"}
		},
		"size without unit": func(s map[string]any) { s["limits"].(map[string]any)["bufferBytes"] = "8 MB" },
		"qos 2":             func(s map[string]any) { s["broker"].(map[string]any)["mqtt"].(map[string]any)["qos"] = 2 },
	} {
		t.Run(name, func(t *testing.T) {
			d := deepCopy(t, valid)
			change(d.(map[string]any)["spec"].(map[string]any))
			if err := s.Validate(d); err == nil {
				t.Error("the schema accepts it")
			}
		})
	}
}

func deepCopy(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	out, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return out
}
