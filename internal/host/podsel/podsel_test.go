package podsel

import (
	"testing"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
)

// A pod is in a selection while its namespace and labels say so: it
// comes in, leaves when relabelled or deleted, and each change of any
// selection's pods moves the generation (and only those).
func TestSelections(t *testing.T) {
	web, _ := labels.Parse("app=web")
	w := New("n1", []Selection{
		{Namespaces: []string{"shop"}, Labels: web},
		{Namespaces: []string{"shop", "jobs"}},
		{},
	}, zap.NewNop())
	in, step := watching(t, w)
	w.set("a", &pod{ns: "shop", labels: map[string]string{"app": "web"}})
	w.set("b", &pod{ns: "jobs", labels: map[string]string{"app": "web"}})
	w.set("c", &pod{ns: "other"})
	step("added", true)
	if in("a") != [3]bool{true, true, true} || in("b") != [3]bool{false, true, true} || in("c") != [3]bool{false, false, true} {
		t.Errorf("a %v b %v c %v", in("a"), in("b"), in("c"))
	}
	w.set("b", &pod{ns: "jobs", labels: map[string]string{"app": "web", "v": "2"}})
	step("a label no selection reads", false)
	w.set("a", &pod{ns: "shop", labels: map[string]string{"app": "api"}})
	step("relabelled", true)
	if in("a") != [3]bool{false, true, true} {
		t.Errorf("relabelled a: %v", in("a"))
	}
	w.set(types.UID("a"), nil)
	step("deleted", true)
	if in("a") != [3]bool{} || in("") != [3]bool{} {
		t.Errorf("deleted a: %v; no uid: %v", in("a"), in(""))
	}
	if all, sel := w.Pods(); all != 2 || sel[0] != 0 || sel[1] != 1 || sel[2] != 2 {
		t.Errorf("Pods: %d %v", all, sel)
	}
}

// A selection by namespace labels follows the namespace: its pods come in
// when it gains the label (the namespace may be seen after its pods) and
// leave when it loses it or is deleted; a selection that also names
// namespaces or pod labels needs all three.
func TestNamespaceLabels(t *testing.T) {
	prod, _ := labels.Parse("env=prod")
	web, _ := labels.Parse("app=web")
	w := New("n1", []Selection{
		{NamespaceLabels: prod},
		{NamespaceLabels: prod, Namespaces: []string{"shop"}, Labels: web},
		{Namespaces: []string{"shop"}},
	}, zap.NewNop())
	if !w.nsWatch {
		t.Fatal("a selection reads namespace labels, but the namespaces are not watched")
	}
	in, step := watching(t, w)
	w.set("a", &pod{ns: "shop", labels: map[string]string{"app": "web"}})
	w.set("b", &pod{ns: "shop", labels: map[string]string{"app": "api"}})
	w.set("c", &pod{ns: "jobs"})
	step("pods before their namespaces", true)
	if in("a") != [3]bool{false, false, true} || in("c") != [3]bool{} {
		t.Errorf("namespaces not seen yet: a %v c %v", in("a"), in("c"))
	}
	w.setNamespace("shop", map[string]string{"env": "prod"}, false)
	step("shop labelled", true)
	w.setNamespace("jobs", map[string]string{"env": "dev"}, false)
	step("jobs, not selected", false)
	if in("a") != [3]bool{true, true, true} || in("b") != [3]bool{true, false, true} || in("c") != [3]bool{} {
		t.Errorf("shop env=prod: a %v b %v c %v", in("a"), in("b"), in("c"))
	}
	w.setNamespace("jobs", map[string]string{"env": "prod"}, false)
	step("jobs relabelled", true)
	if in("c") != [3]bool{true, false, false} {
		t.Errorf("jobs env=prod: c %v", in("c"))
	}
	w.setNamespace("shop", nil, true)
	step("shop deleted", true)
	if in("a") != [3]bool{false, false, true} || in("c") != [3]bool{true, false, false} {
		t.Errorf("shop deleted: a %v c %v", in("a"), in("c"))
	}
	if New("n1", []Selection{{Labels: web}}, zap.NewNop()).nsWatch {
		t.Error("no selection reads namespace labels, but the namespaces would be watched")
	}
}

// watching returns in, which selections of w's three hold a pod, and
// step, which checks whether w's generation moved since the last step.
func watching(t *testing.T, w *Watcher) (in func(uid string) [3]bool, step func(name string, changed bool)) {
	g := w.Generation()
	in = func(uid string) [3]bool { return [3]bool{w.Has(0, uid), w.Has(1, uid), w.Has(2, uid)} }
	step = func(name string, changed bool) {
		t.Helper()
		if now := w.Generation(); (now != g) != changed {
			t.Errorf("%s: generation %d -> %d, want changed %v", name, g, now, changed)
		}
		g = w.Generation()
	}
	return in, step
}
