package brokertest

import (
	"net"
	"testing"
	"time"
)

// dialable reports whether something accepts TCP connections on addr.
func dialable(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// answers reports whether the broker at addr sends anything within d
// after a client's first bytes: a paused broker accepts (the kernel does)
// but never answers.
func answers(addr string, hello []byte, d time.Duration) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	if _, err := c.Write(hello); err != nil {
		return false
	}
	c.SetReadDeadline(time.Now().Add(d))
	_, err = c.Read(make([]byte, 1))
	return err == nil
}

func TestLifecycle(t *testing.T) {
	for _, tc := range []struct {
		name  string
		new   func(testing.TB, ...string) *Broker
		hello []byte
	}{
		// An MQTT 5 CONNECT with client id "b" and a CONNECT "PING" for NATS
		// (nats-server speaks first anyway).
		{"mosquitto", NewMosquitto, []byte{0x10, 0x0e, 0, 4, 'M', 'Q', 'T', 'T', 5, 2, 0, 30, 0, 0, 1, 'b'}},
		{"nats", NewNATS, []byte("PING\r\n")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.new(t)
			if b.Running() || dialable(b.Addr()) {
				t.Fatal("a new broker is already listening")
			}
			b.Start()
			if !b.Running() || !answers(b.Addr(), tc.hello, 5*time.Second) {
				t.Fatal("started broker does not answer")
			}
			addr := b.Addr()
			b.Pause()
			if answers(addr, tc.hello, 300*time.Millisecond) {
				t.Fatal("paused broker answers")
			}
			b.Resume()
			if !answers(addr, tc.hello, 5*time.Second) {
				t.Fatal("resumed broker does not answer")
			}
			b.Kill()
			if b.Running() || dialable(addr) {
				t.Fatal("killed broker still listening")
			}
			b.Restart()
			if b.Addr() != addr || !answers(addr, tc.hello, 5*time.Second) {
				t.Fatal("restarted broker does not answer on its port")
			}
			b.Stop()
			if b.Running() {
				t.Fatal("stopped broker still running")
			}
		})
	}
}
