package weidacli

import (
	"context"
	"fmt"
	"io/fs"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"weida.dev/connector/internal/cli"
	"weida.dev/connector/weida"
)

// TestWeidaSubFailoverPermanent: with several URLs, a failure that every
// address repeats and no retry can change ends sub at once with the
// precise error, as with one URL, instead of redialling until
// --dial-timeout and reporting that no publisher answered.
func TestWeidaSubFailoverPermanent(t *testing.T) {
	// Two replicas: one certificate, one list of admitted clients.
	serverCert, serverKey, _ := writeTestClientCert(t)
	_, _, clientFP := writeTestClientCert(t)
	var urls []string
	var pubs []*cliProc
	for range 2 {
		p, u := startPub(t, "--path", "/p", "--cert", serverCert, "--key", serverKey, "--allow", clientFP, "--quiet")
		pubs, urls = append(pubs, p), append(urls, u)
	}
	wrongPin := func(u string) string {
		return regexp.MustCompile(`sha256:[0-9a-f]{64}@`).ReplaceAllString(u, "sha256:"+strings.Repeat("0", 64)+"@")
	}
	missing := filepath.Join(t.TempDir(), "missing.crt")
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"fingerprint mismatch", []string{wrongPin(urls[0]), wrongPin(urls[1])},
			[]string{"does not match the pin"}},
		{"client refused", []string{urls[0], urls[1]},
			[]string{"refused the client certificate", "give --cert and --key"}},
		{"unreadable --cert", []string{urls[0], urls[1], "--cert", missing, "--key", missing},
			[]string{"missing.crt", "no such file"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			// A dial timeout past the tests' guard: only a sub that stops
			// at the first round can end within it.
			args := append([]string{"sub", "--filter", "", "--dial-timeout", "10m"}, c.args...)
			p := startCLI(t, args...)
			code, _ := p.wait()
			errOut := p.stderr.String()
			if code != cli.ExitFailure {
				t.Errorf("code %d, want %d; stderr %q", code, cli.ExitFailure, errOut)
			}
			for _, w := range c.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("stderr %q lacks %q", errOut, w)
				}
			}
			if strings.Contains(errOut, "no weida publisher answered") || strings.Contains(errOut, "deadline exceeded") {
				t.Errorf("stderr %q reports a timeout, not the failure", errOut)
			}
		})
	}
	for _, p := range pubs {
		_ = p.stdin.Close()
		p.wait()
	}
}

// TestSettled: sub stops redialling only when every address failed for
// good; one address that may yet answer keeps it trying.
func TestSettled(t *testing.T) {
	mismatch := fmt.Errorf("weida: dial weida://h:1/p: %w", weida.ErrFingerprintMismatch)
	refused := fmt.Errorf("weida: dial weida://h:2/p: %w", weida.ErrClientRefused)
	unreadable := fmt.Errorf("weida: dial: loading c and k: %w", &fs.PathError{Op: "open", Path: "c", Err: fs.ErrNotExist})
	timeout := fmt.Errorf("weida: dial weida://h:2/p: %w", context.DeadlineExceeded)
	fe := func(errs ...error) error { return &weida.FailoverError{URLs: make([]string, len(errs)), Errs: errs} }
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"every address mismatches", fe(mismatch, mismatch), true},
		{"mismatch and refused", fe(mismatch, refused), true},
		{"unreadable certificate", fe(unreadable, unreadable), true},
		{"one address silent", fe(mismatch, timeout), false},
		{"one address not tried", fe(mismatch, nil), false},
		{"every address silent", fe(timeout, timeout), false},
		{"one address, mismatch", mismatch, true},
		{"one address, silent", timeout, false},
	} {
		if got := settled(c.err); got != c.want {
			t.Errorf("%s: settled(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// TestWeidaSubRefusedForALimit: a publisher that refuses the connection
// for one of its limits admitted the client, so sub names the limit and
// gives no --cert hint (issue 25: a full endpoint told an anonymous
// subscriber to give a certificate).
func TestWeidaSubRefusedForALimit(t *testing.T) {
	for _, c := range []struct {
		flag, want string
	}{
		{"--max-connections", "max_connections), from all its clients"},
		{"--max-connections-per-address", "this client's address (for IPv6, its /64)"},
	} {
		t.Run(c.flag, func(t *testing.T) {
			pub, url := startPub(t, "--path", "/p", c.flag, "1", "--quiet")
			defer func() {
				_ = pub.stdin.Close()
				pub.wait()
			}()
			ctx, cancel := context.WithTimeout(context.Background(), guard)
			defer cancel()
			held, err := weida.Dial(ctx, url, weida.DialConfig{})
			if err != nil {
				t.Fatalf("the first connection: %v", err)
			}
			defer held.Close()
			code, _, errOut := runCLI(t, "", "sub", url, "--filter", "", "--dial-timeout", "10s")
			if code != cli.ExitFailure {
				t.Errorf("code %d, want %d; stderr %q", code, cli.ExitFailure, errOut)
			}
			if !strings.Contains(errOut, "LIMIT_EXCEEDED") || !strings.Contains(errOut, c.want) {
				t.Errorf("stderr %q does not say which limit refused it (%q)", errOut, c.want)
			}
			if strings.Contains(errOut, "--cert") {
				t.Errorf("stderr %q gives the --cert hint for a limit", errOut)
			}
		})
	}
}

// TestDialHint: the hint follows what refused the dial; only a refused
// client certificate earns --cert.
func TestDialHint(t *testing.T) {
	limit := func(reason string) error {
		return fmt.Errorf("weida: dial: %w", &weida.CloseError{Code: weida.LimitExceeded, Reason: reason, Remote: true})
	}
	refused := fmt.Errorf("weida: dial: %w", weida.ErrClientRefused)
	for _, c := range []struct {
		name     string
		err      error
		certFile string
		want     string
	}{
		{"refused, no certificate", refused, "", "give --cert and --key"},
		{"refused, a certificate", refused, "c.pem", "does not list this certificate"},
		{"max_connections", limit(weida.RefusedMaxConnections), "", "(max_connections), from all its clients"},
		{"per address", limit(weida.RefusedMaxConnectionsPerAddr), "", "(max_connections_per_address)"},
		{"per peer", limit(weida.RefusedMaxConnectionsPerPeer), "c.pem", "(max_connections_per_peer)"},
		{"another limit", limit("max_something"), "", "one of its limits (max_something)"},
		{"local close", &weida.CloseError{Code: weida.LimitExceeded, Reason: "max_connections"}, "", ""},
		{"shutting down", &weida.CloseError{Code: weida.Shutdown, Reason: "listener closing", Remote: true}, "", ""},
	} {
		got := dialHint(c.err, subOptions{certFile: c.certFile})
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: hint %q, want one with %q", c.name, got, c.want)
		}
		if c.want != "" && !strings.Contains(c.want, "--cert") && strings.Contains(got, "--cert") {
			t.Errorf("%s: hint %q names --cert", c.name, got)
		}
	}
}
