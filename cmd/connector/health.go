package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// cmdHealth asks a running connector's admin listener whether it is ready,
// and exits 0 only on a 200. It is the image's health check: the runtime
// image carries no HTTP client, and the binary that serves the probe can
// just as well ask it.
func cmdHealth(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := newFlagSet("health", "connector health [--admin ADDR] [--path /readyz|/readyz/RESOURCE|/healthz] [--timeout DURATION]", stderr)
	admin := fs.String("admin", "127.0.0.1:9090", "the admin listener to ask, as given to run --admin; a wildcard host (:9090, 0.0.0.0:9090) is asked on loopback")
	path := fs.String("path", "/readyz", "the probe: /readyz (the resources are loaded and run), /readyz/RESOURCE (that resource is up) or /healthz (the process serves)")
	timeout := fs.Duration("timeout", 3*time.Second, "how long the answer may take")
	if code, done := parseFlags(fs, args, stdout); done {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "connector health: unexpected argument %q; name the listener with --admin\n", fs.Arg(0))
		return exitUsage
	}
	target, err := probeURL(*admin, *path)
	if err != nil {
		fmt.Fprintf(stderr, "connector health: %v\n", err)
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		fmt.Fprintf(stderr, "connector health: %v\n", err)
		return exitUsage
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "connector health: %s: %v (is the connector running with --admin %s?)\n", target, err, *admin)
		return exitFailure
	}
	defer resp.Body.Close()
	// The probes answer a line or a short list of what is down: enough to
	// say why in `docker inspect`, which keeps the check's output.
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "connector health: %s: %s: %s\n", target, resp.Status, strings.TrimSpace(string(body)))
		return exitFailure
	}
	fmt.Fprintf(stdout, "%s: %s\n", target, strings.TrimSpace(string(body)))
	return exitOK
}

// probeURL is the URL of path on the admin listener at addr. addr is what
// run --admin takes; a listener bound to every address (":9090",
// "0.0.0.0:9090", "[::]:9090") is asked on loopback, where it also listens.
func probeURL(addr, path string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("--admin %q is not host:port (for example 127.0.0.1:9090): %v", addr, err)
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	if !strings.HasPrefix(path, "/") {
		return "", fmt.Errorf("--path %q must start with /", path)
	}
	return "http://" + net.JoinHostPort(host, port) + path, nil
}
