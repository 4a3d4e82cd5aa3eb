package resources_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strings"
	"testing"
	"testing/fstest"
)

const canary = "c4n4ry-s3cret-value"

func TestResolve(t *testing.T) {
	env := map[string]string{"SET": canary, "EMPTY": ""}
	files := fstest.MapFS{
		"nl":    {Data: []byte(canary + "\n")},
		"crlf":  {Data: []byte(canary + "\r\n")},
		"two":   {Data: []byte(canary + "\n\n")},
		"empty": {Data: []byte("\n")},
	}
	r := Resolver{
		LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok },
		ReadFile:  func(p string) ([]byte, error) { return fs.ReadFile(files, p) },
	}
	tests := []struct {
		ref     SecretRef
		want    string
		wantErr string
	}{
		{SecretRef{}, "", ""},
		{SecretRef{Env: "SET"}, canary, ""},
		{SecretRef{Env: "UNSET"}, "", "environment variable UNSET is not set"},
		{SecretRef{Env: "EMPTY"}, "", "environment variable EMPTY is empty"},
		{SecretRef{File: "nl"}, canary, ""},
		{SecretRef{File: "crlf"}, canary, ""},
		{SecretRef{File: "two"}, canary + "\n", ""},
		{SecretRef{File: "empty"}, "", "file empty is empty"},
		{SecretRef{File: "missing"}, "", "file missing: file does not exist"},
	}
	for _, tt := range tests {
		t.Run(tt.ref.String(), func(t *testing.T) {
			s, err := r.Resolve(tt.ref)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, ErrSecret) {
					t.Fatalf("err = %v, want one containing %q wrapping ErrSecret", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), canary) {
					t.Fatalf("the error reveals the secret: %v", err)
				}
				return
			}
			if err != nil || s.Reveal() != tt.want {
				t.Fatalf("Resolve = %q, %v; want %q", s.Reveal(), err, tt.want)
			}
		})
	}
	// The zero Resolver reads the process environment.
	t.Setenv("WEIDA_TEST_SECRET", canary)
	if s, err := (Resolver{}).Resolve(SecretRef{Env: "WEIDA_TEST_SECRET"}); err != nil || s.Reveal() != canary {
		t.Fatalf("os environment: %q %v", s.Reveal(), err)
	}
}

// TestSecretRedacts: no way of printing, logging or encoding a Secret, or a
// struct holding one, shows the value.
func TestSecretRedacts(t *testing.T) {
	s := NewSecret(canary)
	holder := struct {
		User     string
		Password Secret
		Ptr      *Secret
	}{"u", s, &s}

	var outputs []string
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%10s", "%T"} {
		outputs = append(outputs, fmt.Sprintf(verb, s), fmt.Sprintf(verb, holder), fmt.Sprintf(verb, &holder))
	}
	outputs = append(outputs, fmt.Sprint(s), fmt.Sprintln(holder), s.String(), s.GoString())
	j, err := json.Marshal(holder)
	if err != nil {
		t.Fatal(err)
	}
	outputs = append(outputs, string(j))
	text, _ := s.MarshalText()
	outputs = append(outputs, string(text))

	var logs bytes.Buffer
	for _, h := range []slog.Handler{slog.NewTextHandler(&logs, nil), slog.NewJSONHandler(&logs, nil)} {
		l := slog.New(h)
		l.Info("connecting", "password", s, "holder", holder, slog.Any("ptr", &s))
		l.Info("group", slog.Group("creds", "password", s))
	}
	outputs = append(outputs, logs.String())

	for _, out := range outputs {
		if strings.Contains(out, canary) || strings.Contains(out, fmt.Sprintf("%x", canary)) {
			t.Errorf("secret leaked: %s", out)
		}
	}
	if !strings.Contains(logs.String(), redacted) {
		t.Error("logs do not show the redaction marker")
	}
	if s.Reveal() != canary || s.IsZero() || !(Secret{}).IsZero() || (Secret{}).Reveal() != "" {
		t.Error("Reveal/IsZero")
	}
}

// TestLoadNeverShowsSecrets: a secret written literally is refused without
// being repeated, and a secret referred to is never read while loading.
func TestLoadNeverShowsSecrets(t *testing.T) {
	t.Setenv("AMQP_PASSWORD", canary)
	docs := []string{
		edit(t, amqpIn, "password: {env: AMQP_PASSWORD}", "password: "+canary),
		edit(t, amqpIn, "password: {env: AMQP_PASSWORD}", "password: \""+canary+"\""),
		edit(t, amqpIn, "password: {env: AMQP_PASSWORD}", "password: |\n        "+canary),
		edit(t, amqpIn, "password: {env: AMQP_PASSWORD}", "password: ["+canary+"]"),
		edit(t, natsIn, "    url: nats://127.0.0.1:4222\n", "    url: nats://127.0.0.1:4222\n    credentials: {token: "+canary+"}\n"),
		edit(t, amqpOut, "amqp://127.0.0.1", "amqp://guest:"+canary+"@127.0.0.1"),
		edit(t, amqpOut, "amqp://127.0.0.1", "amqp://"+canary+strings.Repeat("x", 150)+"@127.0.0.1"),
		edit(t, amqpIn, "password: {env: AMQP_PASSWORD}", "password: {env: AMQP_PASSWORD, file: "+canary+"}"),
		amqpIn, // valid: refers to AMQP_PASSWORD, which holds the canary
	}
	for i, doc := range docs {
		set, err := loadFiles(t, "r.yaml", doc)
		var out strings.Builder
		if err != nil {
			out.WriteString(err.Error())
		}
		j, _ := json.Marshal(set.Documents)
		out.Write(j)
		fmt.Fprintf(&out, "%+v %#v", set.Documents, set.Connectors())
		for _, e := range Errors(err) {
			fmt.Fprintf(&out, "%+v %#v", *e, *e)
		}
		if strings.Contains(out.String(), canary) && i != 7 { // case 7 names a file path, not a secret
			t.Errorf("document %d: the secret reached the output:\n%s", i, out.String())
		}
		if i < 7 && err == nil {
			t.Errorf("document %d: a literal secret was accepted", i)
		}
	}
}

func TestResolveCredentials(t *testing.T) {
	r := Resolver{LookupEnv: func(k string) (string, bool) { return canary, k == "P" }}
	rc, err := r.Credentials(Credentials{Username: "u", Secrets: map[string]SecretRef{"password": {Env: "P"}}})
	if err != nil || rc.Username != "u" || rc.Secret("password").Reveal() != canary || !rc.Secret("token").IsZero() {
		t.Fatalf("%+v %v", rc, err)
	}
	_, err = r.Credentials(Credentials{Secrets: map[string]SecretRef{"token": {Env: "T"}, "creds": {Env: "C"}}})
	if err == nil || !strings.Contains(err.Error(), "credentials.token") || !strings.Contains(err.Error(), "credentials.creds") || !errors.Is(err, ErrSecret) {
		t.Fatalf("err = %v", err)
	}
	if s := fmt.Sprintf("%v %+v %#v", rc, rc, rc); strings.Contains(s, canary) {
		t.Fatalf("resolved credentials print the secret: %s", s)
	}
}

func TestResolverClientID(t *testing.T) {
	env := map[string]string{"HOSTNAME": "pod-7", "ZONE": "eu", "EMPTY": ""}
	r := Resolver{LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }}
	for _, c := range []struct {
		in, want string
		err      string // substring; "" for none
	}{
		{"orders", "orders", ""},
		{"orders-${HOSTNAME}", "orders-pod-7", ""},
		{"${ZONE}/${HOSTNAME}", "eu/pod-7", ""},
		{"a$b", "a$b", ""},
		{"orders-${MISSING}", "", "MISSING is not set or empty"},
		{"orders-${EMPTY}-${MISSING}", "", "EMPTY, MISSING"},
	} {
		got, err := r.ClientID(c.in)
		switch {
		case c.err == "" && (err != nil || got != c.want):
			t.Errorf("ClientID(%q) = %q, %v; want %q", c.in, got, err, c.want)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("ClientID(%q) = %q, %v; want an error with %q", c.in, got, err, c.err)
		}
	}
}
