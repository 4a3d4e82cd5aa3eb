package deploy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"weida.dev/connector/cmd/drivers"
	"weida.dev/connector/service"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"weida.dev/connector/resources"
	serviceadmin "weida.dev/connector/service/admin"
)

const (
	kubeDir = "kubernetes"
	// secretExample shows the Secrets the Deployment refers to. It is kept
	// out of the kustomization so that applying it never replaces real
	// credentials with placeholders.
	secretExample = "secret.example.yaml"
	kustomizeFile = "kustomization.yaml"
)

// kustomization is the part of kustomize's Kustomization these manifests
// use. It is decoded strictly, so a field added to the file must be added
// here on purpose.
type kustomization struct {
	APIVersion string           `json:"apiVersion"`
	Kind       string           `json:"kind"`
	Resources  []string         `json:"resources"`
	Images     []kustomizeImage `json:"images"`
}

// kustomizeImage replaces an image's name, tag or digest.
type kustomizeImage struct {
	Name    string `json:"name"`
	NewName string `json:"newName,omitempty"`
	NewTag  string `json:"newTag,omitempty"`
	Digest  string `json:"digest,omitempty"`
}

// manifests are the decoded files of deploy/kubernetes.
type manifests struct {
	files           []string // every *.yaml file, by name
	kinds           map[string][]string
	kustomization   kustomization
	deployments     []*appsv1.Deployment
	configMaps      map[string]*corev1.ConfigMap
	services        []*corev1.Service
	secrets         map[string]*corev1.Secret
	serviceMonitors []*monitoringv1.ServiceMonitor
	pdbs            []*policyv1.PodDisruptionBudget
	serviceAccounts []*corev1.ServiceAccount
	roles           []*rbacv1.Role
	roleBindings    []*rbacv1.RoleBinding
}

// strictDecoder decodes YAML or JSON into the registered API types and
// fails on unknown, miscased or duplicated fields, as `kubectl apply
// --validate=strict` would.
func strictDecoder(t *testing.T) runtime.Decoder {
	t.Helper()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, monitoringv1.AddToScheme, policyv1.AddToScheme, rbacv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	return serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
}

// documents splits a multi-document YAML file, leaving out empty documents.
func documents(data []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		j, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return nil, err
		}
		if string(j) == "null" {
			continue
		}
		docs = append(docs, doc)
	}
}

// decodeStrict decodes one document into an API type the scheme knows, or
// a kustomization.
func decodeStrict(dec runtime.Decoder, doc []byte) (any, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return nil, err
	}
	if tm.Kind == "Kustomization" {
		j, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			return nil, err
		}
		var k kustomization
		strict, err := sigsjson.UnmarshalStrict(j, &k, sigsjson.DisallowUnknownFields)
		if err != nil {
			return nil, err
		}
		if err := errors.Join(strict...); err != nil {
			return nil, err
		}
		if k.APIVersion != "kustomize.config.k8s.io/v1beta1" {
			return nil, errors.New("kustomization apiVersion " + k.APIVersion)
		}
		return &k, nil
	}
	obj, _, err := dec.Decode(doc, nil, nil)
	return obj, err
}

func loadManifests(t *testing.T) *manifests {
	t.Helper()
	dec := strictDecoder(t)
	m := &manifests{
		kinds:      make(map[string][]string),
		configMaps: make(map[string]*corev1.ConfigMap),
		secrets:    make(map[string]*corev1.Secret),
	}
	names, err := filepath.Glob(filepath.Join(kubeDir, "*.y*ml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(names) == 0 {
		t.Fatalf("no manifest in %s", kubeDir)
	}
	sawKustomization := false
	for _, name := range names {
		file := filepath.Base(name)
		m.files = append(m.files, file)
		data, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		docs, err := documents(data)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if len(docs) == 0 {
			t.Errorf("%s: no document", file)
		}
		for i, doc := range docs {
			obj, err := decodeStrict(dec, doc)
			if err != nil {
				t.Errorf("%s, document %d: %v", file, i+1, err)
				continue
			}
			switch o := obj.(type) {
			case *kustomization:
				if file != kustomizeFile || sawKustomization {
					t.Errorf("%s: a Kustomization belongs alone in %s", file, kustomizeFile)
				}
				sawKustomization = true
				m.kustomization = *o
				m.kinds[file] = append(m.kinds[file], "Kustomization")
			case *appsv1.Deployment:
				m.deployments = append(m.deployments, o)
				m.kinds[file] = append(m.kinds[file], "Deployment")
			case *corev1.ConfigMap:
				m.configMaps[o.Name] = o
				m.kinds[file] = append(m.kinds[file], "ConfigMap")
			case *corev1.Service:
				m.services = append(m.services, o)
				m.kinds[file] = append(m.kinds[file], "Service")
			case *corev1.Secret:
				m.secrets[o.Name] = o
				m.kinds[file] = append(m.kinds[file], "Secret")
			case *monitoringv1.ServiceMonitor:
				m.serviceMonitors = append(m.serviceMonitors, o)
				m.kinds[file] = append(m.kinds[file], "ServiceMonitor")
			case *policyv1.PodDisruptionBudget:
				m.pdbs = append(m.pdbs, o)
				m.kinds[file] = append(m.kinds[file], "PodDisruptionBudget")
			case *corev1.ServiceAccount:
				m.serviceAccounts = append(m.serviceAccounts, o)
				m.kinds[file] = append(m.kinds[file], "ServiceAccount")
			case *rbacv1.Role:
				m.roles = append(m.roles, o)
				m.kinds[file] = append(m.kinds[file], "Role")
			case *rbacv1.RoleBinding:
				m.roleBindings = append(m.roleBindings, o)
				m.kinds[file] = append(m.kinds[file], "RoleBinding")
			default:
				t.Errorf("%s, document %d: %T has no check in this test; add one", file, i+1, obj)
			}
		}
	}
	if !sawKustomization {
		t.Fatalf("no %s", kustomizeFile)
	}
	if len(m.deployments) != 1 {
		t.Fatalf("%d Deployments, want 1", len(m.deployments))
	}
	return m
}

// TestStrictDecoding shows that the decoder the manifests go through
// refuses what a lax one would drop silently.
func TestStrictDecoding(t *testing.T) {
	dec := strictDecoder(t)
	const head = "apiVersion: v1\nkind: Service\nmetadata:\n  name: x\n"
	for name, doc := range map[string]string{
		"unknown field":   head + "spec:\n  ports:\n    - port: 1\n      protocl: UDP\n",
		"miscased field":  head + "spec:\n  ports:\n    - Port: 1\n",
		"duplicate field": head + "spec:\n  type: ClusterIP\n  type: NodePort\n",
		"kustomization":   "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresource: [a.yaml]\n",
		"unknown kind":    "apiVersion: v1\nkind: Nonesuch\n",
	} {
		if _, err := decodeStrict(dec, []byte(doc)); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
	if _, err := decodeStrict(dec, []byte(head+"spec:\n  ports:\n    - port: 1\n      protocol: UDP\n")); err != nil {
		t.Errorf("a valid Service: %v", err)
	}
}

// runFlag is one flag of `connector run`, read from its --help.
type runFlag struct {
	takesValue bool
	def        string // the default --help prints; "" when none
}

// buildConnector builds the binary the image ships.
func buildConnector(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "connector")
	cmd := exec.Command("go", "build", "-o", bin, "weida.dev/connector/cmd/connector")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

var helpDefault = regexp.MustCompile(`\(default "?(.*?)"?\)$`)

// runFlags parses the flag list `connector run --help` prints (the flag
// package's PrintDefaults layout).
func runFlags(t *testing.T, bin string) map[string]runFlag {
	t.Helper()
	out, err := exec.Command(bin, "run", "--help").Output()
	if err != nil {
		t.Fatalf("connector run --help: %v", err)
	}
	flags := make(map[string]runFlag)
	last := ""
	for line := range strings.Lines(string(out)) {
		line = strings.TrimRight(line, "\n")
		if strings.HasPrefix(line, "  -") {
			head, usage, _ := strings.Cut(line[2:], "\t")
			f := strings.Fields(head)
			last = strings.TrimPrefix(f[0], "-")
			flags[last] = runFlag{takesValue: len(f) > 1}
			line = usage
		}
		if m := helpDefault.FindStringSubmatch(line); m != nil && last != "" {
			f := flags[last]
			f.def = m[1]
			flags[last] = f
		}
	}
	if _, ok := flags["admin"]; !ok {
		t.Fatalf("no -admin in connector run --help:\n%s", out)
	}
	return flags
}

// parseArgs reads a container's args as `connector run` would: the
// subcommand, then flags and their values.
func parseArgs(args []string, flags map[string]runFlag) (map[string][]string, error) {
	if len(args) == 0 || args[0] != "run" {
		return nil, errors.New(`args must start with the subcommand "run"`)
	}
	vals := make(map[string][]string)
	for i := 1; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") || a == "-" || a == "--" {
			return nil, errors.New("argument " + strconv.Quote(a) + " is not a flag: run takes none")
		}
		name, val, hasVal := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		f, ok := flags[name]
		if !ok {
			return nil, errors.New("flag " + strconv.Quote(a) + " is not a flag of connector run")
		}
		if f.takesValue && !hasVal {
			if i+1 == len(args) {
				return nil, errors.New("flag " + strconv.Quote(a) + " has no value")
			}
			i++
			val = args[i]
		}
		vals[name] = append(vals[name], val)
	}
	return vals, nil
}

// portOf resolves a probe's or Service's target port against the
// container's declared ports: a name must name one of the protocol; a
// number stands for itself.
func portOf(c *corev1.Container, p intstr.IntOrString, proto corev1.Protocol) (int32, bool) {
	if p.Type == intstr.Int {
		return p.IntVal, p.IntVal > 0
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal && protocolOr(cp.Protocol) == proto {
			return cp.ContainerPort, true
		}
	}
	return 0, false
}

func protocolOr(p corev1.Protocol) corev1.Protocol {
	if p == "" {
		return corev1.ProtocolTCP
	}
	return p
}

// dockerUID finds the UID of the user the Dockerfile writes into
// /etc/passwd (it writes the line itself: its two bases differ in tools).
var dockerUID = regexp.MustCompile(`'connector:x:(\d+):`)

// imageUID is the user the Dockerfile creates and runs as.
func imageUID(t *testing.T) int64 {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	m := dockerUID.FindSubmatch(data)
	if m == nil {
		t.Fatal("Dockerfile: no connector:x:UID: line for /etc/passwd")
	}
	uid, err := strconv.ParseInt(string(m[1]), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return uid
}

// checkOutput is the part of `connector check --output json` this test reads.
type checkOutput struct {
	Valid     bool `json:"valid"`
	Resources []struct {
		Name     string `json:"name"`
		Valid    bool   `json:"valid"`
		Warnings []struct {
			Field string `json:"field"`
			Rule  string `json:"rule"`
		} `json:"warnings"`
	} `json:"resources"`
}

func TestKubernetes(t *testing.T) {
	m := loadManifests(t)
	a := newAdmin(t)
	bin := buildConnector(t)
	flags := runFlags(t, bin)

	d := m.deployments[0]
	pod := &d.Spec.Template
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("deployment %s: %d containers, want 1", d.Name, len(pod.Spec.Containers))
	}
	c := &pod.Spec.Containers[0]
	args, err := parseArgs(c.Args, flags)
	if err != nil {
		t.Fatalf("container %s args %q: %v", c.Name, c.Args, err)
	}

	t.Run("Kustomization", func(t *testing.T) {
		var want []string
		for _, f := range m.files {
			if f != kustomizeFile && f != secretExample {
				want = append(want, f)
			}
		}
		got := slices.Sorted(slices.Values(m.kustomization.Resources))
		if !slices.Equal(got, want) {
			t.Errorf("kustomization resources %q, want every manifest but %s: %q", got, secretExample, want)
		}
		for _, f := range m.kustomization.Resources {
			if slices.Contains(m.kinds[f], "Secret") {
				t.Errorf("%s holds a Secret: applying it would overwrite the operator's credentials", f)
			}
		}
		repo, _, _ := strings.Cut(c.Image, ":")
		if !slices.ContainsFunc(m.kustomization.Images, func(i kustomizeImage) bool { return i.Name == repo }) {
			t.Errorf("kustomization images do not name the container's image %q", repo)
		}
	})

	t.Run("Selector", func(t *testing.T) {
		sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
		if err != nil {
			t.Fatal(err)
		}
		if sel.Empty() || !sel.Matches(labels.Set(pod.Labels)) {
			t.Errorf("deployment selector %s does not select its pods %v", sel, pod.Labels)
		}
	})

	t.Run("Args", func(t *testing.T) {
		// The binary itself parses the args: --help after them exits 0
		// only if every flag before it exists and its value parses.
		help := append(slices.Clone(c.Args), "--help")
		if out, err := exec.Command(bin, help...).CombinedOutput(); err != nil {
			t.Errorf("connector %s: %v\n%s", strings.Join(help, " "), err, out)
		}
		if len(args["f"]) == 0 {
			t.Error("no -f: the connector would have no resources")
		}
	})

	// The admin listener: its address, the probes, the scrape settings.
	adminPort := 0
	t.Run("Admin", func(t *testing.T) {
		if len(args["admin"]) != 1 {
			t.Fatalf("want one --admin, got %q (the default listens on loopback only, out of the kubelet's reach)", args["admin"])
		}
		host, port, err := net.SplitHostPort(args["admin"][0])
		if err != nil {
			t.Fatalf("--admin %q: %v", args["admin"][0], err)
		}
		if host != "" && host != "0.0.0.0" && host != "::" {
			t.Errorf("--admin %q listens on %s only: probes and scrapes come from outside the pod", args["admin"][0], host)
		}
		if adminPort, err = strconv.Atoi(port); err != nil {
			t.Fatalf("--admin %q: %v", args["admin"][0], err)
		}
	})
	if adminPort == 0 {
		t.FailNow()
	}
	t.Run("Probes", func(t *testing.T) {
		for _, p := range []struct {
			kind  string
			probe *corev1.Probe
			path  string
		}{{"readiness", c.ReadinessProbe, "/readyz"}, {"liveness", c.LivenessProbe, "/healthz"}} {
			if p.probe == nil || p.probe.HTTPGet == nil {
				t.Errorf("no %s HTTP probe", p.kind)
				continue
			}
			g := p.probe.HTTPGet
			if g.Path != p.path {
				t.Errorf("%s probe path %q, want %q (docs/OPERATIONS.md)", p.kind, g.Path, p.path)
			}
			if code := a.get(g.Path); code == http.StatusNotFound || code == http.StatusMethodNotAllowed {
				t.Errorf("%s probe path %q: the admin handler answers %d", p.kind, g.Path, code)
			}
			if port, ok := portOf(c, g.Port, corev1.ProtocolTCP); !ok || int(port) != adminPort {
				t.Errorf("%s probe port %s is %d, want the --admin port %d", p.kind, g.Port.String(), port, adminPort)
			}
			if g.Scheme != "" && g.Scheme != corev1.URISchemeHTTP {
				t.Errorf("%s probe scheme %s: the admin listener speaks plain HTTP", p.kind, g.Scheme)
			}
		}
		// A liveness probe that failed while no resource is up would
		// restart a pod whose broker is merely away.
		if c.LivenessProbe != nil && c.LivenessProbe.HTTPGet != nil {
			if code := a.get(c.LivenessProbe.HTTPGet.Path); code != http.StatusOK {
				t.Errorf("liveness path answers %d with no resource running, want 200", code)
			}
		}
	})

	t.Run("NotReadyAddresses", func(t *testing.T) {
		// The admin Service reaches a pod that is not ready (its page is
		// how an operator sees why); the weida Service only ready ones.
		for _, s := range m.services {
			admin := s.Labels["app.kubernetes.io/component"] == "admin"
			if s.Spec.PublishNotReadyAddresses != admin {
				t.Errorf("service %s: publishNotReadyAddresses %t, want %t", s.Name, s.Spec.PublishNotReadyAddresses, admin)
			}
		}
	})

	t.Run("Scraping", func(t *testing.T) {
		ann := pod.Annotations
		if ann["prometheus.io/scrape"] != "true" {
			t.Errorf("pod annotation prometheus.io/scrape = %q, want \"true\"", ann["prometheus.io/scrape"])
		}
		if ann["prometheus.io/port"] != strconv.Itoa(adminPort) {
			t.Errorf("pod annotation prometheus.io/port = %q, want the admin port %d", ann["prometheus.io/port"], adminPort)
		}
		if p := ann["prometheus.io/path"]; a.get(p) != http.StatusOK {
			t.Errorf("pod annotation prometheus.io/path %q: the admin handler answers %d", p, a.get(p))
		}

		var adminSvc *corev1.Service
		for _, s := range m.services {
			for _, sp := range s.Spec.Ports {
				if port, ok := portOf(c, sp.TargetPort, protocolOr(sp.Protocol)); ok && int(port) == adminPort && protocolOr(sp.Protocol) == corev1.ProtocolTCP {
					adminSvc = s
				}
			}
		}
		if adminSvc == nil {
			t.Fatalf("no Service targets the admin port %d", adminPort)
		}
		if !labels.SelectorFromSet(adminSvc.Spec.Selector).Matches(labels.Set(pod.Labels)) || len(adminSvc.Spec.Selector) == 0 {
			t.Errorf("service %s does not select the connector's pods", adminSvc.Name)
		}
		if len(m.serviceMonitors) != 1 {
			t.Fatalf("%d ServiceMonitors, want 1", len(m.serviceMonitors))
		}
		sm := m.serviceMonitors[0]
		sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range m.services {
			if sel.Matches(labels.Set(s.Labels)) != (s == adminSvc) {
				t.Errorf("ServiceMonitor %s selector %s: selects service %s = %v, want it to select only %s", sm.Name, sel, s.Name, sel.Matches(labels.Set(s.Labels)), adminSvc.Name)
			}
		}
		if len(sm.Spec.Endpoints) == 0 {
			t.Fatalf("ServiceMonitor %s has no endpoints", sm.Name)
		}
		for _, ep := range sm.Spec.Endpoints {
			named := slices.ContainsFunc(adminSvc.Spec.Ports, func(sp corev1.ServicePort) bool { return ep.Port != "" && sp.Name == ep.Port })
			if !named {
				t.Errorf("ServiceMonitor endpoint port %v is not a port name of service %s", ep.Port, adminSvc.Name)
			}
			p := ep.Path
			if p == "" {
				p = "/metrics" // the Operator's default
			}
			if code := a.get(p); code != http.StatusOK {
				t.Errorf("ServiceMonitor endpoint path %q: the admin handler answers %d", p, code)
			}
		}
	})

	t.Run("AdminToken", func(t *testing.T) { checkAdminToken(t, m, a, c, pod, args) })

	t.Run("SecurityContext", func(t *testing.T) {
		ps, cs := pod.Spec.SecurityContext, c.SecurityContext
		if ps == nil {
			ps = &corev1.PodSecurityContext{}
		}
		if cs == nil {
			t.Fatal("no container securityContext")
		}
		// A container's setting overrides the pod's.
		nonRoot, uid := ps.RunAsNonRoot, ps.RunAsUser
		if cs.RunAsNonRoot != nil {
			nonRoot = cs.RunAsNonRoot
		}
		if cs.RunAsUser != nil {
			uid = cs.RunAsUser
		}
		if nonRoot == nil || !*nonRoot {
			t.Error("runAsNonRoot is not true")
		}
		if want := imageUID(t); uid == nil || *uid != want {
			t.Errorf("runAsUser %v, want the Dockerfile's user %d", uid, want)
		}
		if cs.ReadOnlyRootFilesystem == nil || !*cs.ReadOnlyRootFilesystem {
			t.Error("readOnlyRootFilesystem is not true")
		}
		if cs.AllowPrivilegeEscalation == nil || *cs.AllowPrivilegeEscalation {
			t.Error("allowPrivilegeEscalation is not false")
		}
		if cs.Privileged != nil && *cs.Privileged {
			t.Error("privileged")
		}
		if cs.Capabilities == nil || !slices.Contains(cs.Capabilities.Drop, "ALL") || len(cs.Capabilities.Add) > 0 {
			t.Errorf("capabilities %+v, want drop [ALL] and nothing added", cs.Capabilities)
		}
	})

	t.Run("Resources", func(t *testing.T) {
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			req, lim := c.Resources.Requests[r], c.Resources.Limits[r]
			if req.IsZero() || lim.IsZero() {
				t.Errorf("%s: request %s, limit %s; want both", r, req.String(), lim.String())
			} else if req.Cmp(lim) > 0 {
				t.Errorf("%s: request %s above limit %s", r, req.String(), lim.String())
			}
		}
	})

	t.Run("Drain", func(t *testing.T) {
		drain := flags["drain"].def
		if v := args["drain"]; len(v) > 0 {
			drain = v[len(v)-1]
		}
		dd, err := time.ParseDuration(drain)
		if err != nil {
			t.Fatalf("--drain %q: %v", drain, err)
		}
		grace := 30 * time.Second // Kubernetes' default
		if g := pod.Spec.TerminationGracePeriodSeconds; g != nil {
			grace = time.Duration(*g) * time.Second
		}
		if grace <= dd {
			t.Errorf("terminationGracePeriodSeconds %v is not longer than --drain %v: the kubelet would kill the connector while it drains", grace, dd)
		}
	})

	t.Run("StateDir", func(t *testing.T) {
		// Under a read-only root filesystem, the state directory must be
		// a writable volume, or generated identities cannot persist.
		if len(args["state-dir"]) != 1 {
			t.Fatalf("want one --state-dir, got %q", args["state-dir"])
		}
		dir := path.Clean(args["state-dir"][0])
		var mount *corev1.VolumeMount
		for i := range c.VolumeMounts {
			if path.Clean(c.VolumeMounts[i].MountPath) == dir {
				mount = &c.VolumeMounts[i]
			}
		}
		if mount == nil {
			t.Fatalf("--state-dir %s: no volume is mounted there", dir)
		}
		if mount.ReadOnly {
			t.Errorf("--state-dir %s: its volume %s is mounted read-only", dir, mount.Name)
		}
		for _, v := range pod.Spec.Volumes {
			if v.Name == mount.Name && v.EmptyDir == nil && v.PersistentVolumeClaim == nil {
				t.Errorf("--state-dir %s: volume %s is neither an emptyDir nor a PersistentVolumeClaim", dir, v.Name)
			}
		}
	})

	t.Run("Watch", func(t *testing.T) {
		if _, ok := args["watch"]; !ok {
			t.Error("no --watch: a ConfigMap update would not be picked up")
		}
	})

	t.Run("ResourceFiles", func(t *testing.T) { checkResourceFiles(t, m, c, pod, args, bin) })

	t.Run("HighAvailability", func(t *testing.T) { checkHighAvailability(t, m, d, c, args, flags) })

	t.Run("SecretRefs", func(t *testing.T) {
		// Every Secret the pod reads is one secret.example.yaml shows,
		// with the key it reads.
		for _, e := range c.Env {
			if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
				continue
			}
			r := e.ValueFrom.SecretKeyRef
			if !secretHasKey(m, r.Name, r.Key) {
				t.Errorf("env %s reads key %q of Secret %q, which %s does not show", e.Name, r.Key, r.Name, secretExample)
			}
		}
		for _, v := range pod.Spec.Volumes {
			if v.Secret == nil {
				continue
			}
			if _, ok := m.secrets[v.Secret.SecretName]; !ok {
				t.Errorf("volume %s mounts Secret %q, which %s does not show", v.Name, v.Secret.SecretName, secretExample)
			}
			for _, it := range v.Secret.Items {
				if !secretHasKey(m, v.Secret.SecretName, it.Key) {
					t.Errorf("volume %s reads key %q of Secret %q, which %s does not show", v.Name, it.Key, v.Secret.SecretName, secretExample)
				}
			}
		}
	})
}

func secretHasKey(m *manifests, name, key string) bool {
	s, ok := m.secrets[name]
	if !ok {
		return false
	}
	_, inData := s.Data[key]
	_, inString := s.StringData[key]
	return inData || inString
}

// checkResourceFiles runs the ConfigMap's resource files through `connector
// check`, then holds what they name (listen ports, secret files and
// variables, certificates) to what the pod provides.
func checkResourceFiles(t *testing.T, m *manifests, c *corev1.Container, pod *corev1.PodTemplateSpec, args map[string][]string, bin string) {
	mounts := make(map[string]*corev1.Volume) // mount path → volume
	for _, vm := range c.VolumeMounts {
		for i := range pod.Spec.Volumes {
			if v := &pod.Spec.Volumes[i]; v.Name == vm.Name {
				if vm.SubPath != "" {
					t.Errorf("volume mount %s uses subPath: the kubelet never updates such a file", vm.Name)
				}
				mounts[path.Clean(vm.MountPath)] = v
			}
		}
	}

	// The -f directory is the ConfigMap, mounted whole.
	var cm *corev1.ConfigMap
	for _, f := range args["f"] {
		v := mounts[path.Clean(f)]
		if v == nil || v.ConfigMap == nil {
			t.Fatalf("-f %s is not a mounted ConfigMap", f)
		}
		if len(v.ConfigMap.Items) > 0 {
			t.Errorf("ConfigMap volume %s lists items: a resource file added to the ConfigMap would not appear", v.Name)
		}
		if cm = m.configMaps[v.ConfigMap.Name]; cm == nil {
			t.Fatalf("-f %s mounts ConfigMap %q, which no manifest defines", f, v.ConfigMap.Name)
		}
	}
	dir := t.TempDir()
	for key, data := range cm.Data {
		if ext := path.Ext(key); ext != ".yaml" && ext != ".yml" {
			t.Errorf("ConfigMap %s key %q: the connector reads only *.yaml and *.yml files", cm.Name, key)
		}
		if err := os.WriteFile(filepath.Join(dir, key), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	// The real binary checks them as `run` would load them.
	out, err := exec.Command(bin, "check", "-f", dir, "--output", "json").Output()
	if err != nil {
		text, _ := exec.Command(bin, "check", "-f", dir).CombinedOutput()
		t.Fatalf("connector check on ConfigMap %s: %v\n%s", cm.Name, err, text)
	}
	var co checkOutput
	if err := json.Unmarshal(out, &co); err != nil {
		t.Fatalf("connector check --output json: %v\n%s", err, out)
	}
	if !co.Valid || len(co.Resources) != len(cm.Data) {
		t.Errorf("connector check: valid %v, %d resources for %d files", co.Valid, len(co.Resources), len(cm.Data))
	}
	for _, r := range co.Resources {
		for _, w := range r.Warnings {
			// An endpoint open to anyone who reaches the Service is the
			// example's one accepted warning; the files say how to close it.
			if w.Rule != "open-endpoint" {
				t.Errorf("connector check warns about %s %s: %s", r.Name, w.Field, w.Rule)
			}
		}
	}

	set, err := resources.Load(service.Protocols(drivers.All()), dir)
	if err != nil {
		t.Fatalf("resources.Load: %v", err)
	}
	udpPorts := make(map[int32]bool) // container port → a Service exposes it
	holder := holderLabels(pod, set)
	for _, s := range m.services {
		if !labels.SelectorFromSet(s.Spec.Selector).Matches(holder) || len(s.Spec.Selector) == 0 {
			continue
		}
		for _, sp := range s.Spec.Ports {
			if sp.Protocol != corev1.ProtocolUDP {
				continue
			}
			port, ok := portOf(c, sp.TargetPort, corev1.ProtocolUDP)
			if !ok {
				t.Errorf("service %s port %s targets %s, no UDP port of the container", s.Name, sp.Name, sp.TargetPort.String())
				continue
			}
			udpPorts[port] = true
		}
	}
	listened := make(map[int32]bool)
	env := make(map[string]bool)
	for _, e := range c.Env {
		env[e.Name] = true
	}
	for _, r := range set.Connectors() {
		if r.Direction == "inbound" {
			ep := r.Weida.Endpoint
			port := int32(ep.Port)
			listened[port] = true
			if ip := net.ParseIP(ep.Host); ip == nil || !ip.IsUnspecified() {
				t.Errorf("%s listens on %s: in a pod, listen on 0.0.0.0 or :: so that the Service reaches it", r.Name, ep.HostPort())
			}
			if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool {
				return p.ContainerPort == port && p.Protocol == corev1.ProtocolUDP
			}) {
				t.Errorf("%s listens on UDP %d, which the container does not declare", r.Name, port)
			}
			if !udpPorts[port] {
				t.Errorf("%s listens on UDP %d, which no UDP Service exposes", r.Name, port)
			}
		}
		files := []string{r.Weida.CertFile, r.Weida.KeyFile, r.Weida.CAFile, r.Broker.TLS.CAFile, r.Broker.TLS.CertFile, r.Broker.TLS.KeyFile}
		for _, ref := range r.Broker.Credentials.Secrets {
			files = append(files, ref.File)
			if ref.Env != "" && !env[ref.Env] {
				t.Errorf("%s reads the environment variable %s, which the container does not set", r.Name, ref.Env)
			}
		}
		for _, f := range files {
			if f != "" && !providedFile(m, mounts, f) {
				t.Errorf("%s reads %s, which no mounted volume provides", r.Name, f)
			}
		}
	}
	for port := range udpPorts {
		if !listened[port] {
			t.Errorf("a UDP Service exposes port %d, where no resource listens", port)
		}
	}
}

// providedFile reports whether a file path lies in a mounted Secret or
// ConfigMap that holds it.
func providedFile(m *manifests, mounts map[string]*corev1.Volume, file string) bool {
	file = path.Clean(file)
	for dir, v := range mounts {
		rel, ok := strings.CutPrefix(file, dir+"/")
		if !ok {
			continue
		}
		switch {
		case v.Secret != nil:
			if len(v.Secret.Items) == 0 {
				return secretHasKey(m, v.Secret.SecretName, rel)
			}
			for _, it := range v.Secret.Items {
				if it.Path == rel {
					return secretHasKey(m, v.Secret.SecretName, it.Key)
				}
			}
		case v.ConfigMap != nil:
			cm := m.configMaps[v.ConfigMap.Name]
			if cm == nil {
				return false
			}
			_, ok := cm.Data[rel]
			return ok
		}
	}
	return false
}

// checkAdminToken holds the admin listener's token to what the pod and the
// ServiceMonitor provide: --admin-token-file names a key of a mounted
// Secret that secret.example.yaml shows, every ServiceMonitor endpoint
// sends that same key as a Bearer token, and, behind the token, the probes
// still answer the kubelet while the scraped path answers only with it.
func checkAdminToken(t *testing.T, m *manifests, a *admin, c *corev1.Container, pod *corev1.PodTemplateSpec, args map[string][]string) {
	if len(args["admin-token-file"]) != 1 {
		t.Fatalf("want one --admin-token-file, got %q: the admin listener listens beyond loopback, and would serve /metrics and /status to anyone", args["admin-token-file"])
	}
	file := path.Clean(args["admin-token-file"][0])
	var secret, key string
	for _, vm := range c.VolumeMounts {
		rel, ok := strings.CutPrefix(file, path.Clean(vm.MountPath)+"/")
		if !ok {
			continue
		}
		if vm.SubPath != "" {
			t.Errorf("--admin-token-file %s: volume mount %s uses subPath, so a rotated token never reaches the file", file, vm.Name)
		}
		for _, v := range pod.Spec.Volumes {
			if v.Name != vm.Name || v.Secret == nil {
				continue
			}
			secret, key = v.Secret.SecretName, rel
			for _, it := range v.Secret.Items {
				if it.Path == rel {
					key = it.Key
				}
			}
		}
	}
	if secret == "" {
		t.Fatalf("--admin-token-file %s does not lie in a mounted Secret", file)
	}
	if !secretHasKey(m, secret, key) {
		t.Errorf("--admin-token-file %s reads key %q of Secret %q, which %s does not show", file, key, secret, secretExample)
	}

	for _, sm := range m.serviceMonitors {
		for _, ep := range sm.Spec.Endpoints {
			au := ep.Authorization
			switch {
			case au == nil || au.Credentials == nil:
				t.Errorf("ServiceMonitor %s endpoint %s sends no authorization: its scrapes would be refused", sm.Name, ep.Port)
			case au.Type != "" && !strings.EqualFold(au.Type, "Bearer"):
				t.Errorf("ServiceMonitor %s endpoint %s authorization type %q, want Bearer", sm.Name, ep.Port, au.Type)
			case au.Credentials.Name != secret || au.Credentials.Key != key:
				t.Errorf("ServiceMonitor %s endpoint %s sends key %q of Secret %q; the pod reads key %q of Secret %q",
					sm.Name, ep.Port, au.Credentials.Key, au.Credentials.Name, key, secret)
			}
		}
	}

	// The handler as `run --admin-token-file` serves it.
	const token = "manifest-test-token"
	tf := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tf, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := serviceadmin.OpenTokenFile(tf, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := serviceadmin.RequireToken(a.handler, f)
	get := func(p, auth string) int {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, p, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	for _, pr := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe, c.StartupProbe} {
		if pr == nil || pr.HTTPGet == nil {
			continue
		}
		if code := get(pr.HTTPGet.Path, ""); code == http.StatusUnauthorized {
			t.Errorf("probe path %s asks for the token: the kubelet sends none", pr.HTTPGet.Path)
		}
		for _, hd := range pr.HTTPGet.HTTPHeaders {
			if strings.EqualFold(hd.Name, "Authorization") {
				t.Errorf("probe path %s sends an Authorization header: the token would sit in the Deployment", pr.HTTPGet.Path)
			}
		}
	}
	for _, sm := range m.serviceMonitors {
		for _, ep := range sm.Spec.Endpoints {
			p := ep.Path
			if p == "" {
				p = "/metrics"
			}
			if code := get(p, ""); code != http.StatusUnauthorized {
				t.Errorf("scrape path %s without the token answers %d, want 401", p, code)
			}
			if code := get(p, "Bearer "+token); code != http.StatusOK {
				t.Errorf("scrape path %s with the token answers %d, want 200", p, code)
			}
		}
	}
}
