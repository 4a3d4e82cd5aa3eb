package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// configMapDir lays out dir as the kubelet mounts a ConfigMap volume: each
// version of the data in a hidden timestamped directory, ..data a symlink
// to the current one, and each key a symlink through ..data.
type configMapDir struct {
	t       *testing.T
	dir     string
	version int
	current string
}

func newConfigMapDir(t *testing.T, files map[string]string) *configMapDir {
	m := &configMapDir{t: t, dir: t.TempDir()}
	m.update(files)
	for name := range files {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(m.dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

// update writes a new version and swaps ..data to it atomically (a
// symlink renamed over the old one), then removes the old version, as the
// kubelet's atomic writer does.
func (m *configMapDir) update(files map[string]string) {
	m.t.Helper()
	m.version++
	name := fmt.Sprintf("..2026_01_01_00_00_%02d.%09d", m.version, m.version)
	if err := os.Mkdir(filepath.Join(m.dir, name), 0o755); err != nil {
		m.t.Fatal(err)
	}
	for f, content := range files {
		writeFile(m.t, filepath.Join(m.dir, name), f, content)
	}
	tmp := filepath.Join(m.dir, "..data_tmp")
	if err := os.Symlink(name, tmp); err != nil {
		m.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(m.dir, "..data")); err != nil {
		m.t.Fatal(err)
	}
	if m.current != "" {
		if err := os.RemoveAll(filepath.Join(m.dir, m.current)); err != nil {
			m.t.Fatal(err)
		}
	}
	m.current = name
}

// TestWatchConfigMapSwap: `run --watch` on a directory mounted like a
// ConfigMap applies an update (the ..data symlink swapped) without any
// signal, and refuses an invalid one, keeping the running version.
func TestWatchConfigMapSwap(t *testing.T) {
	requireTCP(t, "Mosquitto", mosquittoAddr)
	u := unique()
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/watch", freePort(t, "udp"))
	res := mqttResource{
		Name: "mqtt-watch", Direction: policy.Inbound, QoS: 1, Endpoint: endpoint,
		ClientID: "watch-" + u, Routes: []mqttRoute{{"a", u + "/a/+"}},
	}
	m := newConfigMapDir(t, map[string]string{"r.yaml": res.YAML(t)})
	c := StartConnector(t, nil, "--watch", "-f", m.dir)
	c.WaitReady(30 * time.Second)
	sub := collectWeida(t, endpoint, weida.Limits{}, "#")
	pub := mqttConnect(t, mosquittoAddr, "pub-"+u)
	sub.Sync(20*time.Second, "probe-a", func() { pub.publish(t, 1, u+"/a/probe", "probe-a") })

	// A new version with route b instead of route a.
	res.Routes = []mqttRoute{{"b", u + "/b/#"}}
	m.update(map[string]string{"r.yaml": res.YAML(t)})
	Eventually(t, 20*time.Second, "the change applied", func() bool { return strings.Contains(c.Output(), "reload applied") })
	c.WaitReady(30 * time.Second)
	sub.Sync(20*time.Second, "probe-b", func() { pub.publish(t, 1, u+"/b/probe", "probe-b") })
	pub.publish(t, 1, u+"/a/1", "after")
	pub.publish(t, 1, u+"/b/1/deep", "after")
	Eventually(t, 10*time.Second, "route b bridging", func() bool { return sub.Has(u+".b.1.deep", "after") })
	if sub.Has(u+".a.1", "after") {
		t.Error("the route the update removed still bridges")
	}
	if strings.Count(c.Output(), "reload applied") != 1 {
		t.Errorf("one update, %d reloads:\n%s", strings.Count(c.Output(), "reload applied"), c.Output())
	}

	// A version that does not check is refused; route b runs on.
	bad := res
	bad.Routes = []mqttRoute{{"b", u + "/b/#"}, {"c", u + "/c.d/+"}}
	m.update(map[string]string{"r.yaml": bad.YAML(t)})
	Eventually(t, 20*time.Second, "the change refused", func() bool { return strings.Contains(c.Output(), "reload refused") })
	if !strings.Contains(c.Output(), "mqtt-dotted-level") {
		t.Errorf("the refused change does not say why:\n%s", c.Output())
	}
	pub.publish(t, 1, u+"/b/2", "still")
	Eventually(t, 10*time.Second, "route b still bridging", func() bool { return sub.Has(u+".b.2", "still") })
	if st, ok := c.Status("mqtt-watch"); !ok || !st.ready() {
		t.Errorf("the resource is not running and ready after a refused change:\n%s", c.StatusJSON())
	}
}
