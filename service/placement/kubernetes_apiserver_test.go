package placement

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"weida.dev/connector/internal/brokertest"
)

// kubeAPIServerEnv names a kube-apiserver binary; scripts/kube-apiserver
// builds one from the Go module proxy (k8s.io/kubernetes, minutes, once
// per machine) and prints its path, and scripts/test sets it when built.
const kubeAPIServerEnv = "WEIDA_KUBE_APISERVER"

// TestKubernetesAPIServer runs the Kubernetes backend against a real
// kube-apiserver on loopback, on a three-member etcd of its own, with RBAC
// on: every request the backend makes carries a token of the
// ServiceAccount of deploy/kubernetes/rbac.yaml, bound to that file's Role,
// so the test also proves that the Role's verbs suffice. It covers what the
// fake of kubernetes_test.go can only imitate: the server's own
// resourceVersions and 409 Conflicts, its validation of Lease and Pod
// objects, its merge patches and label selectors, and client-go's real
// HTTP client (TLS, bearer token, its default rate limit). It runs in real
// time, about a minute after the server is up.
//
// Without WEIDA_KUBE_APISERVER it skips: building the server takes minutes
// and CI's budget has no room for it.
func TestKubernetesAPIServer(t *testing.T) {
	bin := os.Getenv(kubeAPIServerEnv)
	if bin == "" {
		t.Skipf("%s is not set: the Kubernetes backend is tested here against client-go's fake only; scripts/kube-apiserver test builds a real API server (minutes, once per machine) and runs this test against it", kubeAPIServerEnv)
	}
	s := startKubeAPIServer(t, bin)
	t.Run("RBAC", func(t *testing.T) { testAPIServerRBAC(t, s) })
	t.Run("CompareAndSwap", func(t *testing.T) { testAPIServerCompareAndSwap(t, s) })
	t.Run("Lease", func(t *testing.T) { testLease(t, s.backend(t, ""), s.backend(t, "")) })
	t.Run("Expiry", func(t *testing.T) { testAPIServerExpiry(t, s) })
	t.Run("Race", func(t *testing.T) { testAPIServerRace(t, s) })
	t.Run("PodLabels", func(t *testing.T) { testAPIServerPodLabels(t, s) })
	t.Run("Placement", func(t *testing.T) { testAPIServerPlacement(t, s) })
}

// kubeAPIServer is a kube-apiserver of the test's own.
type kubeAPIServer struct {
	url    string
	caFile string // the self-signed serving certificate the server made (and its CA)
	admin  kubernetes.Interface
	// sa is the rest.Config InCluster makes of rest.InClusterConfig's: the
	// server, its CA and the ServiceAccount's token, through podConfig.
	sa *rest.Config
}

const (
	apiServerAdminToken = "weida-test-admin"
	apiServerNamespace  = "weida"
)

func startKubeAPIServer(t *testing.T, bin string) *kubeAPIServer {
	t.Helper()
	etcd := brokertest.StartEtcdCluster(t)
	dir := t.TempDir()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	saKey := filepath.Join(dir, "service-account.key")
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(saKey, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	// The administrator, in system:masters, sets the namespace and the RBAC
	// objects up; the backends never use it.
	if err := os.WriteFile(tokens, []byte(apiServerAdminToken+`,weida-test-admin,weida-test-admin,"system:masters"`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	certs := filepath.Join(dir, "certs")
	port := brokertest.FreePort(t, "tcp")
	cmd := exec.Command(bin,
		"--etcd-servers", etcd.Endpoints(),
		"--storage-backend", "etcd3",
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(port),
		"--cert-dir", certs,
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", saKey,
		"--service-account-signing-key-file", saKey,
		"--token-auth-file", tokens,
		"--authorization-mode", "RBAC",
		// Only allocated from, never reached: no Service here has a backend.
		"--service-cluster-ip-range", "10.0.0.0/24",
		// No other API server shares the etcd: nobody to publish this one's
		// address to in the default/kubernetes Endpoints.
		"--endpoint-reconciler-type", "none",
		"--profiling=false")
	var out brokertest.Output
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		if t.Failed() {
			t.Logf("kube-apiserver's output:\n%s", out.String())
		}
	})

	s := &kubeAPIServer{url: "https://127.0.0.1:" + strconv.Itoa(port), caFile: filepath.Join(certs, "apiserver.crt")}
	begin := time.Now()
	s.waitReady(t, done, &out)
	t.Logf("kube-apiserver %s ready in %v", s.url, time.Since(begin).Round(time.Millisecond))

	admin := &rest.Config{Host: s.url, BearerToken: apiServerAdminToken, TLSClientConfig: rest.TLSClientConfig{CAFile: s.caFile}}
	hc, err := rest.HTTPClientFor(admin)
	if err != nil {
		t.Fatal(err)
	}
	// Every client here shares client-go's cached transport of this CA (as
	// the clients of one process do): closing its idle connections ends
	// their goroutines, which goleak would otherwise report.
	t.Cleanup(func() { utilnet.CloseIdleConnectionsFor(hc.Transport) })
	cs, err := kubernetes.NewForConfigAndClient(admin, hc)
	if err != nil {
		t.Fatal(err)
	}
	s.admin = cs
	s.sa = podConfig(&rest.Config{Host: s.url, BearerToken: s.applyRBAC(t), TLSClientConfig: rest.TLSClientConfig{CAFile: s.caFile}})
	return s
}

// waitReady waits until /readyz answers ok: storage, RBAC's bootstrap
// roles and the other post-start hooks are done.
func (s *kubeAPIServer) waitReady(t *testing.T, exited <-chan struct{}, out *brokertest.Output) {
	t.Helper()
	// A loaded two-core machine needs a while to start the server.
	const within = 3 * time.Minute
	deadline := time.Now().Add(within)
	var last string
	for {
		select {
		case <-exited:
			t.Fatalf("kube-apiserver exited before it was ready:\n%s", out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-apiserver not ready after %v (last answer: %s):\n%s", within, last, out.String())
		}
		ok, answer := s.ready()
		if ok {
			return
		}
		last = answer
		time.Sleep(250 * time.Millisecond)
	}
}

func (s *kubeAPIServer) ready() (bool, string) {
	pemCA, err := os.ReadFile(s.caFile)
	if err != nil {
		return false, err.Error() // not written yet
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemCA) {
		return false, "no certificate in " + s.caFile
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequest(http.MethodGet, s.url+"/readyz", nil)
	req.Header.Set("Authorization", "Bearer "+apiServerAdminToken)
	resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode == http.StatusOK, resp.Status + " " + string(body)
}

// applyRBAC creates the namespace and the ServiceAccount, Role and
// RoleBinding of deploy/kubernetes/rbac.yaml, decoded strictly into the
// real API types, and returns a token of that ServiceAccount from the
// TokenRequest API, as the kubelet mounts into a pod.
func (s *kubeAPIServer) applyRBAC(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	if _, err := s.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: apiServerNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join("..", "..", "deploy", "kubernetes", "rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, rbacv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	dec := serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var account string
	kinds := make(map[string]int)
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := dec.Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("rbac.yaml: %v", err)
		}
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			_, err = s.admin.CoreV1().ServiceAccounts(apiServerNamespace).Create(ctx, o, metav1.CreateOptions{})
			account = o.Name
		case *rbacv1.Role:
			_, err = s.admin.RbacV1().Roles(apiServerNamespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = s.admin.RbacV1().RoleBindings(apiServerNamespace).Create(ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("rbac.yaml holds a %T, which this test does not apply", obj)
		}
		if err != nil {
			t.Fatalf("applying rbac.yaml's %T: %v", obj, err)
		}
		kinds[fmt.Sprintf("%T", obj)]++
	}
	if len(kinds) != 3 {
		t.Fatalf("rbac.yaml holds %v; want a ServiceAccount, a Role and a RoleBinding", kinds)
	}
	hour := int64(3600)
	tr, err := s.admin.CoreV1().ServiceAccounts(apiServerNamespace).CreateToken(ctx, account,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &hour}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a token of the ServiceAccount %s: %v", account, err)
	}
	return tr.Status.Token
}

// backend builds the backend as InCluster does from the pod's rest.Config
// (the ServiceAccount's token), on the Leases of the test's namespace;
// with a pod name it labels that pod.
func (s *kubeAPIServer) backend(t *testing.T, pod string) *Kubernetes {
	t.Helper()
	client, err := coordinationclient.NewForConfig(s.sa)
	if err != nil {
		t.Fatal(err)
	}
	k, err := NewKubernetes(client.Leases(apiServerNamespace), "weida-connector.", etcdTiming)
	if err != nil {
		t.Fatal(err)
	}
	if pod != "" {
		core, err := corev1client.NewForConfig(s.sa)
		if err != nil {
			t.Fatal(err)
		}
		k.LabelPod(core.Pods(apiServerNamespace), pod, nil)
		// Registered before a replica's close, so it runs after it.
		t.Cleanup(k.Close)
	}
	return k
}

// flush waits for a whole pass of k's label reconciler, which in real time
// stands for the fake tests' synctest.Wait.
func flush(t *testing.T, k *Kubernetes) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := k.labels.flush(ctx); err != nil {
		t.Fatalf("the label reconciler's pass: %v", err)
	}
}

// createPod creates a pod object as the administrator (no kubelet runs
// it: the object is all the labels need), running as the connector's
// ServiceAccount as the Deployment's pods do.
func (s *kubeAPIServer) createPod(t *testing.T, name string, labels map[string]string) {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: corev1.PodSpec{
			ServiceAccountName: "weida-connector",
			Containers:         []corev1.Container{{Name: "connector", Image: "weida-connector:test"}},
		},
	}
	if _, err := s.admin.CoreV1().Pods(apiServerNamespace).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// testAPIServerRBAC: the ServiceAccount gets no more than the Role says:
// no Lease deletion (it would reset the epoch), no pod creation, nothing in
// another namespace. The other subtests prove that what it does get is
// enough.
func testAPIServerRBAC(t *testing.T, s *kubeAPIServer) {
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(s.sa)
	if err != nil {
		t.Fatal(err)
	}
	leases := cs.CoordinationV1().Leases(apiServerNamespace)
	if _, err := leases.List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("the Role does not allow listing Leases: %v", err)
	}
	for what, err := range map[string]error{
		"delete a Lease":    leases.Delete(ctx, "weida-connector.anything", metav1.DeleteOptions{}),
		"delete the Leases": leases.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}),
		"create a pod": func() error {
			_, err := cs.CoreV1().Pods(apiServerNamespace).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
			return err
		}(),
		"list the Leases of default": func() error {
			_, err := cs.CoordinationV1().Leases("default").List(ctx, metav1.ListOptions{})
			return err
		}(),
		"list the pods of kube-system": func() error { _, err := cs.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{}); return err }(),
	} {
		if !apierrors.IsForbidden(err) {
			t.Errorf("the ServiceAccount may %s: %v; want 403 Forbidden", what, err)
		}
	}
}

// testAPIServerCompareAndSwap is TestKubernetesCompareAndSwap on the real
// server: what the fake's reactor imitates is what the server does.
func testAPIServerCompareAndSwap(t *testing.T, s *kubeAPIServer) {
	client, err := coordinationclient.NewForConfig(s.sa)
	if err != nil {
		t.Fatal(err)
	}
	leases := client.Leases(apiServerNamespace)
	ctx := context.Background()
	created, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "cas"}}, metav1.CreateOptions{})
	if err != nil || created.ResourceVersion == "" {
		t.Fatalf("create: %v, resourceVersion %q", err, created.ResourceVersion)
	}
	first := created.DeepCopy()
	first.Labels = map[string]string{"by": "first"}
	updated, err := leases.Update(ctx, first, metav1.UpdateOptions{})
	if err != nil || updated.ResourceVersion == created.ResourceVersion {
		t.Fatalf("update from the current version: %v, resourceVersion %q -> %q", err, created.ResourceVersion, updated.ResourceVersion)
	}
	second := created.DeepCopy()
	second.Labels = map[string]string{"by": "second"}
	if _, err := leases.Update(ctx, second, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
		t.Fatalf("update from a stale version: %v; want a conflict", err)
	}
	if _, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "cas"}}, metav1.CreateOptions{}); !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating an existing Lease: %v; want AlreadyExists", err)
	}
}

// testAPIServerExpiry: a holder that stops renewing (its process frozen)
// keeps its Lease until another replica has seen the same version for a
// lease duration; then the other takes it with the next epoch, and the old
// claim's renewal meets the server's conflict and reports the loss.
func testAPIServerExpiry(t *testing.T, s *kubeAPIServer) {
	ctx := context.Background()
	a, b := s.backend(t, ""), s.backend(t, "")
	ca, err := a.TryAcquire(ctx, "expiry", "a")
	if err != nil {
		t.Fatal(err)
	}
	var held *HeldError
	if _, err := b.TryAcquire(ctx, "expiry", "b"); !errors.As(err, &held) || held.Holder != "a" {
		t.Fatalf("taking a fresh Lease: %v; want a *HeldError naming a", err)
	}
	time.Sleep(etcdTiming.LeaseDuration / 2)
	if _, err := b.TryAcquire(ctx, "expiry", "b"); !errors.As(err, &held) {
		t.Fatalf("taking a Lease seen for half its duration: %v; want a *HeldError", err)
	}
	time.Sleep(etcdTiming.LeaseDuration/2 + etcdTiming.RetryPeriod)
	cb, err := b.TryAcquire(ctx, "expiry", "b")
	if err != nil {
		t.Fatalf("taking a Lease unchanged for its duration: %v", err)
	}
	if cb.Epoch() != ca.Epoch()+1 {
		t.Fatalf("the takeover has epoch %d; want %d", cb.Epoch(), ca.Epoch()+1)
	}
	if err := ca.Renew(ctx); !errors.Is(err, ErrLost) {
		t.Fatalf("the old holder renewing after the takeover: %v; want ErrLost", err)
	}
	// Its release conflicts too, and must not clear the new holder.
	if err := ca.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if who, epoch, err := a.Holder(ctx, "expiry"); err != nil || who != "b" || epoch != cb.Epoch() {
		t.Fatalf("Holder = %q, %d, %v after the old holder's release; want b, %d", who, epoch, err, cb.Epoch())
	}
	if err := cb.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cb.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// testAPIServerRace: replicas that try to take one free Lease at the same
// moment, first as a create and then as updates of the released object,
// get exactly one holder each round: the others lose on the server's
// AlreadyExists or 409 Conflict, or read the winner's write.
func testAPIServerRace(t *testing.T, s *kubeAPIServer) {
	ctx := context.Background()
	const n, rounds = 4, 6
	var bs []*Kubernetes
	for range n {
		bs = append(bs, s.backend(t, ""))
	}
	var lastEpoch uint64
	lostRaces := 0
	for round := range rounds {
		claims := make([]Claim, n)
		errs := make([]error, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i, b := range bs {
			wg.Go(func() {
				<-start
				claims[i], errs[i] = b.TryAcquire(ctx, "race", fmt.Sprintf("r%d", i))
			})
		}
		close(start)
		wg.Wait()
		var winner Claim
		for i, err := range errs {
			var held *HeldError
			switch {
			case err == nil && winner != nil:
				t.Fatalf("round %d: two replicas took the Lease", round)
			case err == nil:
				winner = claims[i]
			case errors.As(err, &held):
				if held.Holder == "(another replica, just now)" {
					lostRaces++
				}
			default:
				t.Fatalf("round %d: r%d: %v", round, i, err)
			}
		}
		if winner == nil {
			t.Fatalf("round %d: nobody took the free Lease: %v", round, errs)
		}
		if winner.Epoch() <= lastEpoch {
			t.Fatalf("round %d: epoch %d after %d; want it to grow", round, winner.Epoch(), lastEpoch)
		}
		lastEpoch = winner.Epoch()
		if err := winner.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d rounds of %d replicas racing for one Lease: one holder each; %d of the %d losers lost on the server's AlreadyExists or Conflict, the others read the winner's write",
		rounds, n, lostRaces, rounds*(n-1))
}

// testAPIServerPodLabels is TestKubernetesPodLabels on the real server,
// less the refused writes (the fake's reactor does those), with flush for
// synctest.Wait: the labels follow acquisition, release (off before it
// returns), a takeover from a pod that still carries the label, and a
// loss; the first pass sweeps what an earlier run left.
func testAPIServerPodLabels(t *testing.T, s *kubeAPIServer) {
	ctx := context.Background()
	s.createPod(t, "pod-a", map[string]string{"app.kubernetes.io/name": "weida-connector", HoldsLabel("old"): "true"})
	s.createPod(t, "pod-b", map[string]string{"app.kubernetes.io/name": "weida-connector"})
	// The Placement subtest starts afresh: no pod or Lease of this one.
	t.Cleanup(func() {
		ctx := context.Background()
		for _, p := range []string{"pod-a", "pod-b"} {
			if err := s.admin.CoreV1().Pods(apiServerNamespace).Delete(ctx, p, metav1.DeleteOptions{}); err != nil {
				t.Error(err)
			}
		}
		if err := s.admin.CoordinationV1().Leases(apiServerNamespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			t.Error(err)
		}
	})
	a, b := s.backend(t, "pod-a"), s.backend(t, "pod-b")

	flush(t, a)
	wantLabels(t, s.admin, "pod-a")
	if p, err := s.admin.CoreV1().Pods(apiServerNamespace).Get(ctx, "pod-a", metav1.GetOptions{}); err != nil || p.Labels["app.kubernetes.io/name"] != "weida-connector" {
		t.Errorf("the sweep removed pod-a's own labels: %v, %v", p.Labels, err)
	}

	member, err := a.TryAcquire(ctx, memberPrefix+"pod-a", "pod-a")
	if err != nil {
		t.Fatal(err)
	}
	defer member.Release(ctx)
	flush(t, a)
	wantLabels(t, s.admin, "pod-a")

	r1, err := a.TryAcquire(ctx, resourcePrefix+"r1", "pod-a")
	if err != nil {
		t.Fatal(err)
	}
	flush(t, a)
	wantLabels(t, s.admin, "pod-a", "r1")
	if err := r1.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wantLabels(t, s.admin, "pod-a")

	// pod-b takes r1 while pod-a still carries its label.
	if _, err := s.admin.CoreV1().Pods(apiServerNamespace).Patch(ctx, "pod-a", types.MergePatchType, []byte(`{"metadata":{"labels":{"`+HoldsLabel("r1")+`":"true"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	r1b, err := b.TryAcquire(ctx, resourcePrefix+"r1", "pod-b")
	if err != nil {
		t.Fatal(err)
	}
	flush(t, b)
	wantLabels(t, s.admin, "pod-b", "r1")
	wantLabels(t, s.admin, "pod-a")

	// Lost: someone else wrote the Lease; the renewal that meets the
	// conflict drops the label.
	r2, err := a.TryAcquire(ctx, resourcePrefix+"r2", "pod-a")
	if err != nil {
		t.Fatal(err)
	}
	flush(t, a)
	wantLabels(t, s.admin, "pod-a", "r2")
	takenByOther(ctx, t, s.admin, apiServerNamespace, "r2", r2)
	flush(t, a)
	wantLabels(t, s.admin, "pod-a")
	if err := r1b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wantLabels(t, s.admin, "pod-b")
}

// testAPIServerPlacement is TestKubernetesPlacement and
// TestKubernetesPodLabelsPlacement in real time on the real server: three
// replicas labelling their pods spread six resources, hold them steadily,
// fence a paused replica before taking its resources over, give it its
// share back, and take over from one that closes; the labels follow.
func testAPIServerPlacement(t *testing.T, s *kubeAPIServer) {
	resources := resourceNames(6)
	rec := newRecorder(t)
	var rs []*replica
	for _, id := range []string{"a", "b", "c"} {
		s.createPod(t, id, nil)
		rs = append(rs, startReplica(t, s.backend(t, id), id, resources, etcdTiming, rec))
	}
	// A loaded machine slows the server: bounds with room.
	const settle = 20 * time.Second
	took := waitSpread(t, settle, 6, rs...)
	t.Logf("three replicas spread six resources 2/2/2 in %v: %v", took.Round(time.Millisecond), holdings(t, rs...))
	waitLabelsFollow(t, s, settle, resources, rs...)
	quiet(t, rec, etcdTiming.LeaseDuration)

	from := rec.mark()
	pausedAt := time.Now()
	rs[0].pause()
	t.Cleanup(rs[0].resume) // before its close, which a paused replica blocks
	waitSpread(t, 2*etcdTiming.LeaseDuration+etcdTiming.RenewDeadline+slack, 6, rs[1:]...)
	evs, _ := rec.since(from)
	checkFencedTakeover(t, evs, rs[0].id, pausedAt, etcdTiming, slack)
	waitLabelsFollow(t, s, settle, resources, rs[1:]...)
	rs[0].resume()
	took = waitSpread(t, settle, 6, rs...)
	t.Logf("the resumed replica got its share back in %v", took.Round(time.Millisecond))
	waitLabelsFollow(t, s, settle, resources, rs...)

	closedAt := time.Now()
	rs[2].close()
	took = waitSpread(t, etcdTiming.LeaseDuration+etcdTiming.RetryPeriod+slack, 6, rs[:2]...)
	t.Logf("closing a replica moved its resources to the survivors in %v (after %v closing)", took.Round(time.Millisecond), time.Since(closedAt).Round(time.Millisecond)-took.Round(time.Millisecond))
	waitLabelsFollow(t, s, settle, resources, rs[:2]...)
}

// waitLabelsFollow waits until checkLabelsFollow would pass: a label write
// inside a lease operation gets half of the operation's time, and one that
// a slow server misses is retried at the next renewal or round.
func waitLabelsFollow(t *testing.T, s *kubeAPIServer, within time.Duration, resources []string, rs ...*replica) {
	t.Helper()
	begin := time.Now()
	for {
		problems := labelsMisplaced(t, s.admin, resources, rs...)
		if len(problems) == 0 {
			return
		}
		if time.Since(begin) > within {
			t.Fatalf("after %v the labels do not follow the leases: %v", within, problems)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestKubernetesLostAnswer pins on the fake what the real server showed
// (TestKubernetesAPIServer/Lease failed two runs in three before the fix):
// a write the server applies but whose answer is lost, as when Release
// cancels a renewal in flight, leaves the claim a version behind. The next
// renewal must not report the lease lost, and a release after it must
// still free the lease at once rather than conflict and leave it to
// expire.
func TestKubernetesLostAnswer(t *testing.T) {
	cs := casClientset()
	var lose atomic.Bool
	cs.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		u := a.(k8stesting.UpdateAction)
		gvr := coordinationv1.SchemeGroupVersion.WithResource("leases")
		obj := u.GetObject().DeepCopyObject().(*coordinationv1.Lease)
		stored, err := cs.Tracker().Get(gvr, u.GetNamespace(), obj.Name)
		if err != nil || stored.(metav1.Object).GetResourceVersion() != obj.ResourceVersion || !lose.CompareAndSwap(true, false) {
			return false, nil, nil // casClientset's reactor handles it
		}
		obj.ResourceVersion += "+"
		if err := cs.Tracker().Update(gvr, obj, u.GetNamespace()); err != nil {
			return true, nil, err
		}
		return true, nil, errors.New("the test lost the answer after the write was applied")
	})
	ctx := context.Background()
	a, b := newKubernetesBackend(t, cs), newKubernetesBackend(t, cs)
	c, err := a.TryAcquire(ctx, "one", "a")
	if err != nil {
		t.Fatal(err)
	}
	lose.Store(true)
	if err := c.Renew(ctx); err == nil || errors.Is(err, ErrLost) {
		t.Fatalf("a renewal whose answer was lost: %v; want an error, not ErrLost", err)
	}
	if err := c.Renew(ctx); err != nil {
		t.Fatalf("renewing over its own applied write: %v; want the lease still held", err)
	}
	lose.Store(true)
	_ = c.Renew(ctx)
	if err := c.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if who, _, err := b.Holder(ctx, "one"); err != nil || who != "" {
		t.Fatalf("after releasing over its own applied write, Holder = %q, %v; want none", who, err)
	}
	cb, err := b.TryAcquire(ctx, "one", "b")
	if err != nil {
		t.Fatalf("taking the released lease: %v", err)
	}
	if cb.Epoch() != c.Epoch()+1 {
		t.Fatalf("epoch %d after %d", cb.Epoch(), c.Epoch())
	}
	// A conflict with another's acquisition is still a loss.
	if err := c.Renew(ctx); !errors.Is(err, ErrLost) {
		t.Fatalf("renewing after another took the lease: %v; want ErrLost", err)
	}
}

// TestPodConfigUnthrottled: InCluster's clients have no client-side rate
// limit, which starved the Placer against a real API server (see
// podConfig); the real-server test needs WEIDA_KUBE_APISERVER, this one
// keeps the setting in every run.
func TestPodConfigUnthrottled(t *testing.T) {
	cfg := podConfig(&rest.Config{Host: "https://127.0.0.1:1", BearerToken: "x"})
	client, err := coordinationclient.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if l := client.RESTClient().GetRateLimiter(); l != nil {
		t.Fatalf("InCluster's Lease client is rate limited (%T, %.0f/s)", l, l.QPS())
	}
}
