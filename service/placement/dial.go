package placement

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
)

// DialEtcd returns an Etcd backend on a client of endpoints (URLs such as
// http://10.0.0.1:2379), keeping its keys under prefix, and the function
// that closes the client. The client reconnects after at most half a
// second: gRPC's default backoff grows to two minutes, far beyond a lease,
// and would keep a replica away long after the cluster is back.
func DialEtcd(endpoints []string, prefix string, t Timing) (*Etcd, func(), error) {
	if len(endpoints) == 0 {
		return nil, nil, errors.New("placement: etcd needs at least one endpoint")
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 2 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
			MinConnectTimeout: 500 * time.Millisecond,
		})},
	})
	if err != nil {
		return nil, nil, fmt.Errorf("placement: etcd client of %s: %w", strings.Join(endpoints, ","), err)
	}
	e, err := NewEtcd(cli, prefix, t)
	if err != nil {
		cli.Close()
		return nil, nil, err
	}
	return e, func() { _ = cli.Close() }, nil
}

// serviceAccountNamespace is where Kubernetes mounts the pod's namespace.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// InCluster returns a Kubernetes backend on the Lease objects of namespace
// through the pod's service account. An empty namespace is the pod's own
// (POD_NAMESPACE, else the service account's mounted namespace file).
//
// When POD_NAME is set (the downward API's metadata.name), the backend
// also labels that pod, in the pod's own namespace, with the resources it
// holds ([Kubernetes.LabelPod]), logging on log; without it no pod is
// labelled, and a Service cannot follow the leases.
func InCluster(namespace, prefix string, t Timing, log *slog.Logger) (*Kubernetes, error) {
	own := os.Getenv("POD_NAMESPACE")
	if own == "" {
		if b, err := os.ReadFile(serviceAccountNamespace); err == nil {
			own = strings.TrimSpace(string(b))
		}
	}
	if namespace == "" {
		namespace = own
	}
	if namespace == "" {
		return nil, fmt.Errorf("placement: kubernetes: no namespace given and none mounted (%s): set --lease-namespace or POD_NAMESPACE", serviceAccountNamespace)
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("placement: kubernetes: not running in a pod with a service account: %w", err)
	}
	cfg = podConfig(cfg)
	client, err := coordinationclient.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("placement: kubernetes client: %w", err)
	}
	k, err := NewKubernetes(client.Leases(namespace), prefix, t)
	if err != nil {
		return nil, err
	}
	pod := os.Getenv("POD_NAME")
	if pod == "" || own == "" {
		if log != nil {
			log.Warn("placement: kubernetes: POD_NAME or the pod's namespace is unknown, so this pod is not labelled with the resources it holds: a Service selecting holds.weida.dev/<resource> cannot reach it (set POD_NAME and POD_NAMESPACE from the downward API)")
		}
		return k, nil
	}
	core, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("placement: kubernetes client: %w", err)
	}
	k.LabelPod(core.Pods(own), pod, log)
	return k, nil
}

// podConfig turns off client-go's client-side rate limit (5 requests a
// second, bursts of 10, per client). The backend's requests are already
// bounded by the Placer, one round and one renewal per holding every
// retry period, but a replica below its share also reads every Lease it
// may take each round: against a real API server the limit starved the
// round's list, and a paused replica's resources were never taken over
// (TestKubernetesAPIServer/Placement). The API server's own priority and
// fairness queues protect it instead.
func podConfig(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = -1, 0
	return cfg
}
