package main

import (
	"strings"
	"testing"
)

const traces = `File: e2e.test
Type: cpu
-----------+-------------------------------------------------------
      30ms   internal/runtime/syscall/linux.Syscall6
             syscall.Syscall
             net.(*conn).Write
             weida.dev/connector/connectors/mqtt.(*bufferedConn).Unlock
             github.com/eclipse/paho.golang/packets.(*ControlPacket).WriteTo
             weida.dev/connector/connectors/mqtt.(*Sink).Write
-----------+-------------------------------------------------------
      20ms   runtime.selectgo
             weida.dev/connector/connectors/nats.(*Source).Read
             weida.dev/connector/connectors.(*Bridge).runInbound
-----------+-------------------------------------------------------
      10ms   runtime.scanobject
             runtime.gcDrain
             runtime.gcBgMarkWorker
-----------+-------------------------------------------------------
      10ms   runtime.futex
             runtime.futexwakeup
             runtime.notewakeup
             runtime.wakep
             runtime.ready
             weida.dev/connector/connectors/nats.(*Source).deliver
-----------+-------------------------------------------------------
      10ms   runtime.memmove
             github.com/quic-go/quic-go.(*SendStream).Write
             weida.dev/connector/weida.(*serverConn).writer
-----------+-------------------------------------------------------
      10ms   runtime.findRunnable
             runtime.schedule
             runtime.park_m
             runtime.mcall
-----------+-------------------------------------------------------
      10ms   sync/atomic.(*Int32).Add (inline)
             weida.dev/connector/connectors/conntest.Measure
`

func TestClassify(t *testing.T) {
	stacks, ms, err := parseTraces(strings.NewReader(traces))
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		owner, fn string
		ms        float64
	}{
		{ownerClient, "weida.dev/connector/connectors/mqtt.(*bufferedConn).Unlock", 30},
		{ownerConnector, "weida.dev/connector/connectors/nats.(*Source).Read", 20},
		{ownerGC, "", 10},
		{ownerSched, "", 10},
		{ownerWeida, "github.com/quic-go/quic-go.(*SendStream).Write", 10},
		{ownerSched, "", 10},
		{ownerRig, "weida.dev/connector/connectors/conntest.Measure", 10},
	}
	if len(stacks) != len(want) {
		t.Fatalf("%d stacks, want %d", len(stacks), len(want))
	}
	for i, w := range want {
		owner, fn := classify(stacks[i])
		if owner != w.owner || fn != w.fn || ms[i] != w.ms {
			t.Errorf("stack %d: %q %q %vms, want %q %q %vms", i, owner, fn, ms[i], w.owner, w.fn, w.ms)
		}
	}
}
