// Package podsel keeps, for a node, the set of Kubernetes pods that each
// of a list of selections (namespaces by name or by label, a pod label
// selector) selects, from a watch of the API server's pods on that node
// (and of its namespaces, when a selection reads their labels), so that a process can be
// selected by the pod its cgroup names (normalize.PodUIDOfPath) before it
// is sampled. The pods on a node are in the API before the kubelet starts
// their containers, so a process's pod is normally known when it starts.
package podsel

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Selection selects pods: in one of Namespaces (any namespace when empty)
// whose labels NamespaceLabels matches (any when nil), and whose own
// labels Labels matches (every pod when nil).
type Selection struct {
	Namespaces      []string
	NamespaceLabels labels.Selector
	Labels          labels.Selector
}

// selects applies s to a pod of namespace ns with labels l; nsLabels are
// the namespace's labels (nil while the watch has not seen it: then a
// NamespaceLabels selector sees a namespace without labels).
func (s Selection) selects(ns string, l, nsLabels map[string]string) bool {
	if len(s.Namespaces) > 0 && !slices.Contains(s.Namespaces, ns) {
		return false
	}
	if s.NamespaceLabels != nil && !s.NamespaceLabels.Matches(labels.Set(nsLabels)) {
		return false
	}
	return s.Labels == nil || s.Labels.Matches(labels.Set(l))
}

// pod is what the watch keeps of a pod: its namespace and labels.
type pod struct {
	ns     string
	labels map[string]string
}

// Watcher holds the pods of one node that each Selection selects. Safe for
// concurrent use.
type Watcher struct {
	sels []Selection
	node string
	log  *zap.Logger

	mu   sync.RWMutex
	pods map[types.UID]pod
	// namespaces: the labels of each namespace, when a selection reads
	// them (nsWatch).
	namespaces map[string]map[string]string
	nsWatch    bool
	// in[i]: the UIDs of the pods sels[i] selects.
	in  []map[string]struct{}
	gen atomic.Uint64
}

// New makes a Watcher for the pods on node; Run fills it.
func New(node string, sels []Selection, log *zap.Logger) *Watcher {
	w := &Watcher{
		sels: sels, node: node, log: log, pods: map[types.UID]pod{}, namespaces: map[string]map[string]string{},
		in: make([]map[string]struct{}, len(sels)),
	}
	for i := range w.in {
		w.in[i] = map[string]struct{}{}
	}
	for _, s := range sels {
		w.nsWatch = w.nsWatch || s.NamespaceLabels != nil
	}
	return w
}

// Has reports whether selection i selects the pod with uid (dashed, as
// the API writes it).
func (w *Watcher) Has(i int, uid string) bool {
	if uid == "" {
		return false
	}
	w.mu.RLock()
	defer w.mu.RUnlock()
	_, ok := w.in[i][uid]
	return ok
}

// Generation changes whenever a selection gains or loses a pod: a decision
// taken on an older generation may be stale.
func (w *Watcher) Generation() uint64 { return w.gen.Load() }

// Pods returns how many pods of the node the watch holds, and how many
// each selection selects.
func (w *Watcher) Pods() (all int, selected []int) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	selected = make([]int, len(w.in))
	for i, s := range w.in {
		selected[i] = len(s)
	}
	return len(w.pods), selected
}

// set records p (nil: deleted) and updates the selections.
func (w *Watcher) set(uid types.UID, p *pod) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if p == nil {
		delete(w.pods, uid)
	} else {
		w.pods[uid] = *p
	}
	if w.place(uid, p) {
		w.gen.Add(1)
	}
}

// setNamespace records the labels of namespace ns (nil: deleted) and
// places its pods again.
func (w *Watcher) setNamespace(ns string, l map[string]string, deleted bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if deleted {
		delete(w.namespaces, ns)
	} else {
		if l == nil {
			l = map[string]string{}
		}
		w.namespaces[ns] = l
	}
	changed := false
	for uid, p := range w.pods {
		if p.ns == ns {
			changed = w.place(uid, &p) || changed
		}
	}
	if changed {
		w.gen.Add(1)
	}
}

// place puts the pod in the selections that select it and takes it out
// of the others, reporting whether any changed. w.mu is held.
func (w *Watcher) place(uid types.UID, p *pod) (changed bool) {
	for i, s := range w.sels {
		_, was := w.in[i][string(uid)]
		now := p != nil && s.selects(p.ns, p.labels, w.namespaces[p.ns])
		switch {
		case now && !was:
			w.in[i][string(uid)] = struct{}{}
			changed = true
		case was && !now:
			delete(w.in[i], string(uid))
			changed = true
		}
	}
	return changed
}

// Run watches the node's pods through client until ctx ends. It returns
// once the first list is in (synced true), or after syncTimeout without
// it (synced false: the watch goes on trying, and pods are selected as
// they arrive), or when ctx ends; done is closed when the watch has
// stopped.
func (w *Watcher) Run(ctx context.Context, client kubernetes.Interface, syncTimeout time.Duration) (synced bool, done <-chan struct{}, err error) {
	if w.node == "" {
		return false, nil, errors.New("podsel: no node name")
	}
	f := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = "spec.nodeName=" + w.node
		}))
	inf := f.Core().V1().Pods().Informer()
	// Only the namespace and labels are used: the cache keeps little more
	// than that of each pod.
	if err := inf.SetTransform(func(o any) (any, error) {
		p, ok := o.(*corev1.Pod)
		if !ok {
			return o, nil
		}
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
			Name: p.Name, Namespace: p.Namespace, UID: p.UID, Labels: p.Labels, ResourceVersion: p.ResourceVersion,
		}}, nil
	}); err != nil {
		return false, nil, fmt.Errorf("podsel: %w", err)
	}
	if _, err := inf.AddEventHandler(handlers(
		func(p *corev1.Pod) { w.set(p.UID, &pod{ns: p.Namespace, labels: p.Labels}) },
		func(p *corev1.Pod) { w.set(p.UID, nil) },
	)); err != nil {
		return false, nil, fmt.Errorf("podsel: %w", err)
	}
	infs := []cache.SharedIndexInformer{inf}
	if w.nsWatch {
		nsInf, err := w.namespaceInformer(client)
		if err != nil {
			return false, nil, err
		}
		infs = append(infs, nsInf)
	}
	stopped := make(chan struct{})
	var wg sync.WaitGroup
	hasSynced := make([]cache.InformerSynced, len(infs))
	for i, inf := range infs {
		hasSynced[i] = inf.HasSynced
		wg.Go(func() { inf.RunWithContext(ctx) })
	}
	go func() {
		defer close(stopped)
		wg.Wait()
	}()
	sctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	synced = cache.WaitForCacheSync(sctx.Done(), hasSynced...)
	return synced, stopped, nil
}

// namespaceInformer watches the cluster's namespaces for their labels
// (the chart's agent ClusterRole lists and watches them). A namespace is
// a name and some labels: its cache stays small.
func (w *Watcher) namespaceInformer(client kubernetes.Interface) (cache.SharedIndexInformer, error) {
	inf := informers.NewSharedInformerFactory(client, 0).Core().V1().Namespaces().Informer()
	if err := inf.SetTransform(func(o any) (any, error) {
		n, ok := o.(*corev1.Namespace)
		if !ok {
			return o, nil
		}
		return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: n.Name, UID: n.UID, Labels: n.Labels, ResourceVersion: n.ResourceVersion,
		}}, nil
	}); err != nil {
		return nil, fmt.Errorf("podsel: %w", err)
	}
	if _, err := inf.AddEventHandler(handlers(
		func(n *corev1.Namespace) { w.setNamespace(n.Name, n.Labels, false) },
		func(n *corev1.Namespace) { w.setNamespace(n.Name, nil, true) },
	)); err != nil {
		return nil, fmt.Errorf("podsel: %w", err)
	}
	return inf, nil
}

// handlers calls set with each object of type T added or updated, and
// gone with each deleted (also when the watch missed the deletion).
func handlers[T any](set, gone func(*T)) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) {
			if v, ok := o.(*T); ok {
				set(v)
			}
		},
		UpdateFunc: func(_, o any) {
			if v, ok := o.(*T); ok {
				set(v)
			}
		},
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			if v, ok := o.(*T); ok {
				gone(v)
			}
		},
	}
}
