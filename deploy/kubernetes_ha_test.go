package deploy

import (
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"weida.dev/connector/cmd/drivers"
	"weida.dev/connector/resources"
	"weida.dev/connector/service"
	"weida.dev/connector/service/placement"
)

// holderLabels are the labels of a pod of the Deployment that holds every
// resource of set: its template's, plus the holder label of each.
func holderLabels(pod *corev1.PodTemplateSpec, set *resources.Set) labels.Set {
	l := labels.Set{}
	for k, v := range pod.Labels {
		l[k] = v
	}
	for _, r := range set.Connectors() {
		l[placement.HoldsLabel(r.Name)] = "true"
	}
	return l
}

// podMounts maps each mount path of c to its volume.
func podMounts(c *corev1.Container, pod *corev1.PodTemplateSpec) map[string]*corev1.Volume {
	mounts := make(map[string]*corev1.Volume)
	for _, vm := range c.VolumeMounts {
		for i := range pod.Spec.Volumes {
			if v := &pod.Spec.Volumes[i]; v.Name == vm.Name {
				mounts[path.Clean(vm.MountPath)] = v
			}
		}
	}
	return mounts
}

// resourceSet loads the ConfigMap the container reads with -f.
func resourceSet(t *testing.T, m *manifests, c *corev1.Container, pod *corev1.PodTemplateSpec, args map[string][]string) *resources.Set {
	t.Helper()
	mounts := podMounts(c, pod)
	dir := t.TempDir()
	for _, f := range args["f"] {
		v := mounts[path.Clean(f)]
		if v == nil || v.ConfigMap == nil || m.configMaps[v.ConfigMap.Name] == nil {
			t.Fatalf("-f %s is not a mounted ConfigMap of the manifests", f)
		}
		for key, data := range m.configMaps[v.ConfigMap.Name].Data {
			if err := os.WriteFile(filepath.Join(dir, key), []byte(data), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	set, err := resources.Load(service.Protocols(drivers.All()), dir)
	if err != nil {
		t.Fatalf("resources.Load: %v", err)
	}
	return set
}

// lastArg returns the last value of a flag, or its --help default.
func lastArg(args map[string][]string, flags map[string]runFlag, name string) string {
	if v := args[name]; len(v) > 0 {
		return v[len(v)-1]
	}
	return flags[name].def
}

// checkHighAvailability holds the manifests to docs/OPERATIONS.md, "High
// availability": three replicas sharing the resources through Leases, a
// rollout and a budget that keep two of them up, the RBAC the backend's
// calls need, one identity for all, and a Service per endpoint that
// reaches only the holder.
func checkHighAvailability(t *testing.T, m *manifests, d *appsv1.Deployment, c *corev1.Container, args map[string][]string, flags map[string]runFlag) {
	pod := &d.Spec.Template
	set := resourceSet(t, m, c, pod, args)

	t.Run("Replicas", func(t *testing.T) {
		if d.Spec.Replicas == nil || *d.Spec.Replicas != 3 {
			t.Errorf("replicas %v, want 3", d.Spec.Replicas)
		}
		st := d.Spec.Strategy
		if st.Type != appsv1.RollingUpdateDeploymentStrategyType || st.RollingUpdate == nil {
			t.Fatalf("strategy %+v, want RollingUpdate", st)
		}
		// The new pod joins as a standby before an old one is stopped, so
		// that each of the old pod's resources moves once, straight to it
		// (deployment.yaml says why).
		ru := st.RollingUpdate
		if ru.MaxSurge == nil || *ru.MaxSurge != intstr.FromInt32(1) {
			t.Errorf("maxSurge %v, want 1", ru.MaxSurge)
		}
		if ru.MaxUnavailable == nil || *ru.MaxUnavailable != intstr.FromInt32(0) {
			t.Errorf("maxUnavailable %v, want 0", ru.MaxUnavailable)
		}
	})

	t.Run("Placement", func(t *testing.T) {
		if got := args["placement"]; !slices.Equal(got, []string{"kubernetes"}) {
			t.Errorf("--placement %q, want kubernetes", got)
		}
		if got := args["replica-id"]; !slices.Equal(got, []string{"$(POD_NAME)"}) {
			t.Errorf("--replica-id %q, want $(POD_NAME): the pod name, which the backend labels", got)
		}
		for name, field := range map[string]string{"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"} {
			i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name })
			if i < 0 || c.Env[i].ValueFrom == nil || c.Env[i].ValueFrom.FieldRef == nil || c.Env[i].ValueFrom.FieldRef.FieldPath != field {
				t.Errorf("env %s is not the downward API's %s", name, field)
			}
		}
		// A fenced resource must not settle in-flight messages after its
		// lease may have moved: the drain fits in the lease's margin.
		drain, err1 := time.ParseDuration(lastArg(args, flags, "drain"))
		lease, err2 := time.ParseDuration(lastArg(args, flags, "lease-duration"))
		renew, err3 := time.ParseDuration(lastArg(args, flags, "lease-renew-deadline"))
		if err1 != nil || err2 != nil || err3 != nil {
			t.Fatalf("durations: %v %v %v", err1, err2, err3)
		}
		if drain > lease-renew {
			t.Errorf("--drain %v is longer than the lease margin %v (lease duration %v - renew deadline %v)", drain, lease-renew, lease, renew)
		}
	})

	t.Run("ResetKey", func(t *testing.T) {
		files := args["reset-key-file"]
		if len(files) != 1 {
			t.Fatalf("--reset-key-file %q, want one: every replica needs the same stateless reset key", files)
		}
		if !providedFile(m, podMounts(c, pod), files[0]) {
			t.Errorf("--reset-key-file %s: no mounted Secret that %s shows provides it", files[0], secretExample)
		}
	})

	var sa *corev1.ServiceAccount
	t.Run("ServiceAccount", func(t *testing.T) {
		name := pod.Spec.ServiceAccountName
		i := slices.IndexFunc(m.serviceAccounts, func(s *corev1.ServiceAccount) bool { return s.Name == name })
		if name == "" || i < 0 {
			t.Fatalf("the pod runs as service account %q, which no manifest defines", name)
		}
		sa = m.serviceAccounts[i]
		mount := pod.Spec.AutomountServiceAccountToken
		if mount == nil {
			mount = sa.AutomountServiceAccountToken
		}
		if mount != nil && !*mount {
			t.Error("the service account token is not mounted: the connector cannot reach the API server")
		}
	})

	t.Run("RBAC", func(t *testing.T) {
		if sa == nil {
			t.Skip("no service account")
		}
		var role *rbacv1.Role
		for _, b := range m.roleBindings {
			bound := slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool {
				return s.Kind == rbacv1.ServiceAccountKind && s.Name == sa.Name && (s.Namespace == "" || s.Namespace == sa.Namespace)
			})
			if !bound {
				continue
			}
			if b.RoleRef.APIGroup != rbacv1.GroupName || b.RoleRef.Kind != "Role" {
				t.Errorf("RoleBinding %s refers to %s %s: want a Role of %s", b.Name, b.RoleRef.APIGroup, b.RoleRef.Kind, rbacv1.GroupName)
				continue
			}
			i := slices.IndexFunc(m.roles, func(r *rbacv1.Role) bool { return r.Name == b.RoleRef.Name })
			if i < 0 {
				t.Errorf("RoleBinding %s refers to Role %s, which no manifest defines", b.Name, b.RoleRef.Name)
				continue
			}
			role = m.roles[i]
		}
		if role == nil {
			t.Fatalf("no RoleBinding binds a Role to the service account %s", sa.Name)
		}
		// The calls of service/placement's Kubernetes backend.
		for _, need := range []struct{ group, resource, verb string }{
			{"coordination.k8s.io", "leases", "get"},
			{"coordination.k8s.io", "leases", "list"},
			{"coordination.k8s.io", "leases", "create"},
			{"coordination.k8s.io", "leases", "update"},
			{"", "pods", "get"},
			{"", "pods", "list"},
			{"", "pods", "patch"},
		} {
			if !allows(role, need.group, need.resource, need.verb) {
				t.Errorf("Role %s does not allow %s on %s.%s", role.Name, need.verb, need.resource, need.group)
			}
		}
		// Deleting a Lease resets its epoch, the fencing token.
		if allows(role, "coordination.k8s.io", "leases", "delete") {
			t.Errorf("Role %s allows deleting Leases, which the connector never needs", role.Name)
		}
	})

	t.Run("PodDisruptionBudget", func(t *testing.T) {
		if len(m.pdbs) != 1 {
			t.Fatalf("%d PodDisruptionBudgets, want 1", len(m.pdbs))
		}
		b := m.pdbs[0]
		sel, err := metav1.LabelSelectorAsSelector(b.Spec.Selector)
		if err != nil {
			t.Fatal(err)
		}
		if sel.Empty() || !sel.Matches(labels.Set(pod.Labels)) {
			t.Errorf("PodDisruptionBudget %s selector %s does not select the connector's pods %v", b.Name, sel, pod.Labels)
		}
		if b.Spec.MaxUnavailable == nil || *b.Spec.MaxUnavailable != intstr.FromInt32(1) || b.Spec.MinAvailable != nil {
			t.Errorf("PodDisruptionBudget %s: maxUnavailable %v, minAvailable %v; want maxUnavailable 1", b.Name, b.Spec.MaxUnavailable, b.Spec.MinAvailable)
		}
	})

	t.Run("EndpointServices", func(t *testing.T) {
		// Every inbound resource has one Service, which selects the pods
		// of the Deployment holding that resource, and only them, and
		// exposes that resource's listen port.
		inbound := make(map[string]*resources.Connector)
		for _, r := range set.Connectors() {
			if r.Direction == "inbound" {
				inbound[r.Name] = r
			}
		}
		served := make(map[string]string) // resource → Service
		for _, s := range m.services {
			if s.Labels["app.kubernetes.io/component"] == "admin" {
				continue
			}
			var holds []string
			rest := labels.Set{}
			for k, v := range s.Spec.Selector {
				if r, ok := strings.CutPrefix(k, placement.HoldsLabelPrefix); ok {
					holds = append(holds, r)
					if v != "true" {
						t.Errorf("service %s selects %s=%q; the holder's pod carries \"true\"", s.Name, k, v)
					}
					continue
				}
				rest[k] = v
			}
			if len(holds) != 1 {
				t.Errorf("service %s selects holder labels of %q, want exactly one resource's", s.Name, holds)
				continue
			}
			r := inbound[holds[0]]
			if r == nil {
				t.Errorf("service %s selects the holder of %q, which is no inbound resource of the ConfigMap", s.Name, holds[0])
				continue
			}
			if len(rest) == 0 || !labels.SelectorFromSet(rest).Matches(labels.Set(pod.Labels)) {
				t.Errorf("service %s: the rest of its selector %v does not select the Deployment's pods %v", s.Name, rest, pod.Labels)
			}
			if labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(pod.Labels)) {
				t.Errorf("service %s selects a pod that holds nothing", s.Name)
			}
			if prev, dup := served[r.Name]; dup {
				t.Errorf("services %s and %s both serve %s", prev, s.Name, r.Name)
			}
			served[r.Name] = s.Name
			for _, sp := range s.Spec.Ports {
				port, ok := portOf(c, sp.TargetPort, protocolOr(sp.Protocol))
				if protocolOr(sp.Protocol) != corev1.ProtocolUDP || !ok || int(port) != r.Weida.Endpoint.Port {
					t.Errorf("service %s port %s (%s %s) does not target %s's UDP listen port %d", s.Name, sp.Name, protocolOr(sp.Protocol), sp.TargetPort.String(), r.Name, r.Weida.Endpoint.Port)
				}
			}
		}
		for name := range inbound {
			if served[name] == "" {
				t.Errorf("inbound resource %s has no Service selecting its holder", name)
			}
		}
	})
}

// allows reports whether role grants verb on resource of group.
func allows(role *rbacv1.Role, group, resource, verb string) bool {
	for _, r := range role.Rules {
		if (slices.Contains(r.APIGroups, group) || slices.Contains(r.APIGroups, "*")) &&
			(slices.Contains(r.Resources, resource) || slices.Contains(r.Resources, "*")) &&
			(slices.Contains(r.Verbs, verb) || slices.Contains(r.Verbs, "*")) {
			return true
		}
	}
	return false
}
