package placement_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes/fake"

	"weida.dev/connector/service/placement"
)

// A replica runs a Placer over the resources every replica loads; it starts
// a resource in OnStart under the Assignment's context and stops it in
// OnStop. Here the only replica holds both; a real deployment passes
// clientset.CoordinationV1().Leases(namespace) of an in-cluster client (or
// NewEtcd with an etcd client).
func ExamplePlacer() {
	leases := fake.NewClientset().CoordinationV1().Leases("weida")
	backend, err := placement.NewKubernetes(leases, "weida-connector.", placement.DefaultTiming)
	if err != nil {
		panic(err)
	}
	var mu sync.Mutex
	var log []string
	note := func(s string) { mu.Lock(); log = append(log, s); mu.Unlock() }
	p, err := placement.NewPlacer(placement.Config{
		Backend:   backend,
		Identity:  "pod-0",
		Resources: []string{"orders-in", "orders-out"},
		OnStart: func(a placement.Assignment) {
			note(fmt.Sprintf("start %s at epoch %d", a.Resource, a.Epoch))
		},
		OnStop: func(resource string, epoch uint64, reason error) {
			note(fmt.Sprintf("stop %s at epoch %d: %v", resource, epoch, reason))
		},
	})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	for len(p.Held()) < 2 {
		time.Sleep(10 * time.Millisecond)
	}
	cancel() // as on SIGTERM: release everything at once
	<-done
	slices.Sort(log)
	for _, line := range log {
		fmt.Println(line)
	}
	// Output:
	// start orders-in at epoch 1
	// start orders-out at epoch 1
	// stop orders-in at epoch 1: placement: placer closed: placement: lease released
	// stop orders-out at epoch 1: placement: placer closed: placement: lease released
}
