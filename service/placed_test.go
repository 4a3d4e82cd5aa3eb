package service

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"weida.dev/connector/connectors"
	"weida.dev/connector/policy"
	"weida.dev/connector/service/placement"
)

// standbyReplica is replica r0 of three, holding nothing: another replica
// holds resource a (MQTT inbound), nobody holds b (NATS outbound); ended
// says why resources stopped here.
func standbyReplica(ended map[string]string) (*placed, *prometheus.Registry) {
	reg := prometheus.NewRegistry()
	rt := connectors.NewRuntime(connectors.Deps{Metrics: connectors.NewMetrics(reg)})
	p := &placed{
		rt:      rt,
		cfg:     Config{Placement: Placement{Backend: "etcd", Identity: "r0"}},
		metrics: newPlacementMetrics(reg),
		held:    map[string]uint64{},
		since:   map[string]time.Time{},
		ended:   ended,
		view:    placement.View{Holders: map[string]string{"a": "r1"}, Members: []string{"r0", "r1", "r2"}},
	}
	p.setUnits([]connectors.Unit{
		{Spec: connectors.Spec{Name: "a", Protocol: policy.MQTT, Direction: policy.Inbound}},
		{Spec: connectors.Spec{Name: "b", Protocol: policy.NATS, Direction: policy.Outbound}},
	})
	return p, reg
}

// A replica that holds nothing is ready, and reports every resource it
// stands by for with its holder, the standbys and why it is not running it
// here: readiness never depends on resources held elsewhere.
func TestPlacedStandbyStatuses(t *testing.T) {
	p, _ := standbyReplica(map[string]string{"b": "stopped here at epoch 7: " + placement.ErrRenewDeadline.Error()})
	if !p.Ready() {
		t.Error("a replica holding nothing is not ready")
	}
	st := p.Statuses()
	if len(st) != 2 {
		t.Fatalf("%d statuses, want both resources", len(st))
	}
	a, b := st[0], st[1]
	if a.Placement == nil || a.Placement.Role != roleStandby || a.Placement.Holder != "r1" ||
		strings.Join(a.Placement.Standbys, ",") != "r0,r2" || !a.Ready() || a.Conditions[0].Reason != "Standby" {
		t.Errorf("a: %+v %+v, want a ready standby of r1 with standbys r0, r2", a.Placement, a.Conditions)
	}
	if b.Placement == nil || b.Placement.Role != roleUnheld || b.Placement.Holder != "" || !b.Ready() ||
		!strings.Contains(b.Conditions[0].Message, "epoch 7") {
		t.Errorf("b: %+v %+v, want unheld, saying it stopped here at epoch 7", b.Placement, b.Conditions)
	}

	p.viewErr = errors.New("context deadline exceeded")
	if st := p.Statuses(); st[0].Conditions[0].Reason != "CoordinationUnreachable" || !strings.Contains(st[0].Conditions[0].Message, "does not answer") {
		t.Errorf("with the service unreachable: %+v", st[0].Conditions)
	}
	if !p.Ready() {
		t.Error("an unreachable coordination service made a replica holding nothing unready")
	}
}
