// Package podsel keeps, for a node, the set of Kubernetes pods that each
// of a list of selections (namespaces, a pod label selector) selects, from
// a watch of the API server's pods on that node, so that a process can be
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
// and whose labels Labels matches (every pod when nil).
type Selection struct {
	Namespaces []string
	Labels     labels.Selector
}

func (s Selection) selects(ns string, l map[string]string) bool {
	if len(s.Namespaces) > 0 && !slices.Contains(s.Namespaces, ns) {
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
	// in[i]: the UIDs of the pods sels[i] selects.
	in  []map[string]struct{}
	gen atomic.Uint64
}

// New makes a Watcher for the pods on node; Run fills it.
func New(node string, sels []Selection, log *zap.Logger) *Watcher {
	w := &Watcher{sels: sels, node: node, log: log, pods: map[types.UID]pod{}, in: make([]map[string]struct{}, len(sels))}
	for i := range w.in {
		w.in[i] = map[string]struct{}{}
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
	changed := false
	if p == nil {
		delete(w.pods, uid)
	} else {
		w.pods[uid] = *p
	}
	for i, s := range w.sels {
		_, was := w.in[i][string(uid)]
		now := p != nil && s.selects(p.ns, p.labels)
		switch {
		case now && !was:
			w.in[i][string(uid)] = struct{}{}
			changed = true
		case was && !now:
			delete(w.in[i], string(uid))
			changed = true
		}
	}
	if changed {
		w.gen.Add(1)
	}
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
	update := func(o any) {
		if p, ok := o.(*corev1.Pod); ok {
			w.set(p.UID, &pod{ns: p.Namespace, labels: p.Labels})
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    update,
		UpdateFunc: func(_, o any) { update(o) },
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			if p, ok := o.(*corev1.Pod); ok {
				w.set(p.UID, nil)
			}
		},
	}); err != nil {
		return false, nil, fmt.Errorf("podsel: %w", err)
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		inf.RunWithContext(ctx)
	}()
	sctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	synced = cache.WaitForCacheSync(sctx.Done(), inf.HasSynced)
	return synced, stopped, nil
}
