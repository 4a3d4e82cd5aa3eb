package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"weida.dev/connector/policy"
)

// runCommand runs the connector binary with args and returns its exit
// code and output; it fails the test when the process has not ended
// within d: the bugs these tests guard against hang forever.
func runCommand(t *testing.T, d time.Duration, args ...string) (int, string) {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := exec.CommandContext(c, connectorBin, args...)
	out, err := cmd.CombinedOutput()
	if c.Err() != nil {
		t.Fatalf("connector %s did not end within %s:\n%s", strings.Join(args, " "), d, out)
	}
	if err != nil && cmd.ProcessState == nil {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), string(out)
}

func mkfifo(t *testing.T, path string) string {
	t.Helper()
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestFIFOResourceFileRefused: a named pipe given as a resource file, or
// sitting in a resource directory, makes check and run exit 1 at once
// with the path and what it is; nothing starts.
func TestFIFOResourceFileRefused(t *testing.T) {
	dir := t.TempDir()
	fifo := mkfifo(t, filepath.Join(dir, "pipe.yaml"))
	for _, args := range [][]string{
		{"check", "-f", fifo},
		{"check", "-f", dir},
		{"run", "-f", fifo, "--admin", "", "--state-dir", t.TempDir()},
		{"run", "-f", dir, "--admin", "", "--state-dir", t.TempDir()},
	} {
		code, out := runCommand(t, 15*time.Second, args...)
		if code != 1 || !strings.Contains(out, fifo) || !strings.Contains(out, "is a named pipe (FIFO), not a regular file") || !strings.Contains(out, "file-not-regular") {
			t.Errorf("connector %s: exit %d\n%s", strings.Join(args, " "), code, out)
		}
		if args[0] == "run" && !strings.Contains(out, "nothing was started") {
			t.Errorf("connector %s:\n%s", strings.Join(args, " "), out)
		}
	}
}

// TestFIFOAtReloadKeepsSignals: a named pipe dropped into the watched
// directory before SIGHUP refuses the reload, the running resource goes
// on, and SIGTERM still ends the process promptly.
func TestFIFOAtReloadKeepsSignals(t *testing.T) {
	requireTCP(t, "Mosquitto", mosquittoAddr)
	u := unique()
	res := mqttResource{
		Name: "fifo-reload", Direction: policy.Inbound, QoS: 1,
		Endpoint: fmt.Sprintf("weida://127.0.0.1:%d/fifo", freePort(t, "udp")),
		Routes:   []mqttRoute{{"r", u + "/+"}},
	}
	dir := t.TempDir()
	writeFile(t, dir, "a.yaml", res.YAML(t))
	c := StartConnector(t, nil, "-f", dir)
	c.WaitReady(30 * time.Second)

	fifo := mkfifo(t, filepath.Join(dir, "b.yaml"))
	c.Signal(syscall.SIGHUP)
	Eventually(t, 10*time.Second, "the reload refused", func() bool { return strings.Contains(c.Output(), "reload refused") })
	if out := c.Output(); !strings.Contains(out, fifo) || !strings.Contains(out, "file-not-regular") {
		t.Errorf("the refused reload does not name the pipe:\n%s", out)
	}
	if st, ok := c.Status("fifo-reload"); !ok || !st.ready() {
		t.Errorf("the running resource stopped:\n%s", c.StatusJSON())
	}
	start := time.Now()
	if code := c.Stop(); code != 0 {
		t.Errorf("exit code %d after SIGTERM", code)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("SIGTERM took %s", took)
	}
}

// TestFIFOSecretRefused: a secret file that is a named pipe (or a device)
// stops run before anything starts, naming the file, instead of blocking
// it. check reads no secret, so it passes.
func TestFIFOSecretRefused(t *testing.T) {
	dir := t.TempDir()
	for _, secret := range []string{mkfifo(t, filepath.Join(dir, "password")), "/dev/zero"} {
		res := mqttResource{
			Name: "fifo-secret", Direction: policy.Inbound, QoS: 1,
			Endpoint: fmt.Sprintf("weida://127.0.0.1:%d/s", freePort(t, "udp")),
			Routes:   []mqttRoute{{"r", unique() + "/+"}},
		}
		yaml := strings.Replace(res.YAML(t), "    mqtt:\n",
			fmt.Sprintf("    credentials:\n      username: bridge\n      password: {file: %s}\n    mqtt:\n", secret), 1)
		file := writeFile(t, dir, "r.yaml", yaml)
		if code, out := runCommand(t, 15*time.Second, "check", "-f", file); code != 0 {
			t.Errorf("check: exit %d\n%s", code, out)
		}
		code, out := runCommand(t, 15*time.Second, "run", "-f", file, "--admin", "", "--state-dir", t.TempDir())
		if code != 1 || !strings.Contains(out, secret+" is a") || !strings.Contains(out, "not a regular file") || !strings.Contains(out, "nothing was started") {
			t.Errorf("run with the secret %s: exit %d\n%s", secret, code, out)
		}
	}
}

// TestFilterNotUTF8Refused: a route filter holding a byte that is not
// UTF-8 is refused by check, on the route's line.
func TestFilterNotUTF8Refused(t *testing.T) {
	res := mqttResource{
		Name: "utf8", Direction: policy.Inbound, QoS: 1, Endpoint: "weida://127.0.0.1:7999/u",
		Routes: []mqttRoute{{"r", "sensors/LATIN1/x"}},
	}
	yaml := strings.Replace(res.YAML(t), "LATIN1", "caf\xe9", 1)
	file := writeFile(t, t.TempDir(), "r.yaml", yaml)
	code, out := runCommand(t, 15*time.Second, "check", "-f", file)
	if code != 1 || !strings.Contains(out, "spec.routes[0].filter") || !strings.Contains(out, "[invalid-utf8]") {
		t.Errorf("check: exit %d\n%s", code, out)
	}
}
