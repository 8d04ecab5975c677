package helmtest

import (
	"slices"
	"strings"
	"testing"
)

// The agent's Kubernetes metadata (kubernetesMetadata): a read-only
// ClusterRole bound to an account only the agent uses, the token mounted
// in the agent alone, k8s_attributes on its own node's pods, associating by
// what the receiver reads from cgroups.
func TestKubernetesMetadataRBAC(t *testing.T) {
	d := mustTemplate(t)
	ds := d.must(t, "DaemonSet", agentName)
	pod := mapping(ds, "spec", "template", "spec")
	sa := str(pod, "serviceAccountName")
	wantEqual(t, "agent serviceAccountName", sa, agentName)
	if pod["automountServiceAccountToken"] != true {
		t.Errorf("agent automountServiceAccountToken = %v, want true", pod["automountServiceAccountToken"])
	}
	d.must(t, "ServiceAccount", agentName)

	role := d.must(t, "ClusterRole", namespace+"-"+agentName)
	got := map[string][]string{} // apiGroup/resource -> verbs
	for _, r := range list(role, "rules") {
		for _, g := range strs(r, "apiGroups") {
			for _, res := range strs(r, "resources") {
				got[g+"/"+res] = append(got[g+"/"+res], strs(r, "verbs")...)
			}
		}
	}
	want := []string{"get", "list", "watch"}
	for _, k := range []string{"/pods", "/namespaces", "apps/replicasets"} {
		v := slices.Sorted(slices.Values(got[k]))
		if !slices.Equal(v, want) {
			t.Errorf("ClusterRole verbs on %q = %v, want %v", k, v, want)
		}
		delete(got, k)
	}
	if len(got) != 0 {
		t.Errorf("ClusterRole grants more than it needs: %v", got)
	}
	for _, r := range list(role, "rules") {
		for _, v := range strs(r, "verbs") {
			if v != "get" && v != "list" && v != "watch" {
				t.Errorf("ClusterRole verb %q is not read-only", v)
			}
		}
	}

	b := d.must(t, "ClusterRoleBinding", namespace+"-"+agentName)
	wantEqual(t, "binding roleRef", str(b, "roleRef", "name"), str(role, "metadata", "name"))
	wantEqual(t, "binding roleRef kind", str(b, "roleRef", "kind"), "ClusterRole")
	subj := list(b, "subjects")
	if len(subj) != 1 || str(subj[0], "kind") != "ServiceAccount" || str(subj[0], "name") != sa || str(subj[0], "namespace") != namespace {
		t.Errorf("binding subjects %v, want the agent's ServiceAccount %s/%s", subj, namespace, sa)
	}

	// Only the agent may read the API: the gateway and the store keep the
	// shared account, no token.
	for _, o := range []obj{d.must(t, "Deployment", gatewayName), d.must(t, "StatefulSet", release+"-symbols")} {
		p := mapping(o, "spec", "template", "spec")
		if str(p, "serviceAccountName") == sa || p["automountServiceAccountToken"] != false {
			t.Errorf("%s: serviceAccountName %v, automount %v", str(o, "metadata", "name"), p["serviceAccountName"], p["automountServiceAccountToken"])
		}
	}

	e := env(container(ds))
	wantEqual(t, "K8S_NODE_NAME fieldPath", str(e["K8S_NODE_NAME"], "valueFrom", "fieldRef", "fieldPath"), "spec.nodeName")

	cfg := collectorConfig(t, d.must(t, "ConfigMap", agentName))
	k := mapping(cfg, "processors", "k8s_attributes")
	if k == nil {
		t.Fatal("agent config has no k8s_attributes processor")
	}
	wantEqual(t, "filter.node_from_env_var", str(k, "filter", "node_from_env_var"), "K8S_NODE_NAME")
	wantEqual(t, "auth_type", str(k, "auth_type"), "serviceAccount")
	var assoc []string
	for _, a := range list(k, "pod_association") {
		var names []string
		for _, src := range list(a, "sources") {
			if str(src, "from") != "resource_attribute" {
				t.Errorf("association source %v is not a resource attribute", src)
			}
			names = append(names, str(src, "name"))
		}
		assoc = append(assoc, strings.Join(names, "+"))
	}
	if !slices.Equal(assoc, []string{"k8s.pod.uid", "container.id"}) {
		t.Errorf("pod_association = %v, want [k8s.pod.uid container.id]", assoc)
	}
	md := strs(k, "extract", "metadata")
	for _, m := range []string{"k8s.namespace.name", "k8s.pod.name", "k8s.container.name", "k8s.deployment.name", "k8s.statefulset.name", "k8s.daemonset.name"} {
		if !slices.Contains(md, m) {
			t.Errorf("extract.metadata %v lacks %s", md, m)
		}
	}
	procs := strs(cfg, "service", "pipelines", "profiles", "processors")
	if i := slices.Index(procs, "k8s_attributes"); i < 0 || slices.Index(procs, "memory_limiter") > i {
		t.Errorf("agent profiles processors %v: want k8s_attributes after memory_limiter", procs)
	}

	// The gateway keeps what the agent added: nothing in its pipelines
	// rewrites or drops resource attributes.
	gw := collectorConfig(t, d.must(t, "ConfigMap", gatewayName))
	for name, p := range mapping(gw, "service", "pipelines") {
		for _, proc := range strs(p, "processors") {
			if proc != "memory_limiter" && proc != "symbolization" {
				t.Errorf("gateway %s pipeline runs %s: check it keeps the agents' k8s.* resource attributes", name, proc)
			}
		}
	}
}

// kubernetesMetadata.enabled=false: no RBAC, no agent account, no token,
// no k8s_attributes.
func TestKubernetesMetadataOff(t *testing.T) {
	d := mustTemplate(t, "--set", "kubernetesMetadata.enabled=false")
	for _, o := range d {
		switch o["kind"] {
		case "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
			t.Errorf("%v %s rendered with kubernetesMetadata off", o["kind"], str(o, "metadata", "name"))
		}
	}
	if d.find("ServiceAccount", agentName) != nil {
		t.Error("agent ServiceAccount rendered with kubernetesMetadata off")
	}
	ds := d.must(t, "DaemonSet", agentName)
	pod := mapping(ds, "spec", "template", "spec")
	wantEqual(t, "agent serviceAccountName", str(pod, "serviceAccountName"), release)
	if pod["automountServiceAccountToken"] != false {
		t.Errorf("agent automountServiceAccountToken = %v, want false", pod["automountServiceAccountToken"])
	}
	if _, ok := env(container(ds))["K8S_NODE_NAME"]; ok {
		t.Error("K8S_NODE_NAME set with kubernetesMetadata off")
	}
	cfg := collectorConfig(t, d.must(t, "ConfigMap", agentName))
	if mapping(cfg, "processors", "k8s_attributes") != nil {
		t.Error("k8s_attributes configured with kubernetesMetadata off")
	}
	for name, p := range mapping(cfg, "service", "pipelines") {
		if slices.Contains(strs(p, "processors"), "k8s_attributes") {
			t.Errorf("agent %s pipeline runs k8s_attributes with kubernetesMetadata off", name)
		}
	}
}

// An existing account (serviceAccount.create=false) is bound as named.
func TestKubernetesMetadataExistingAccount(t *testing.T) {
	d := mustTemplate(t, "--set", "serviceAccount.create=false", "--set", "serviceAccount.agentName=node-reader")
	if d.find("ServiceAccount", "node-reader") != nil || d.find("ServiceAccount", agentName) != nil {
		t.Error("a ServiceAccount rendered with serviceAccount.create=false")
	}
	wantEqual(t, "agent serviceAccountName", str(d.must(t, "DaemonSet", agentName), "spec", "template", "spec", "serviceAccountName"), "node-reader")
	b := d.must(t, "ClusterRoleBinding", namespace+"-"+agentName)
	wantEqual(t, "binding subject", str(b, "subjects", "0", "name"), "node-reader")
}
