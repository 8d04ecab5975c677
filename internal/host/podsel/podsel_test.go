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
	in := func(uid string) [3]bool { return [3]bool{w.Has(0, uid), w.Has(1, uid), w.Has(2, uid)} }
	g := w.Generation()
	step := func(name string, changed bool) {
		t.Helper()
		if now := w.Generation(); (now != g) != changed {
			t.Errorf("%s: generation %d -> %d, want changed %v", name, g, now, changed)
		}
		g = w.Generation()
	}
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
