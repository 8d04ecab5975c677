package profilingreceiver // import "github.com/profsym/profsym/receiver/profilingreceiver"

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/profsym/profsym/internal/host/podsel"
)

// KubernetesTargetConfig selects the processes of pods on this node: those
// in one of Namespaces (any when empty) whose labels NamespaceLabels
// selects (any when empty), and whose own labels PodLabels selects (every
// pod when empty). A process is found by the pod UID its cgroup
// path carries, as the kubelet names cgroups (systemd and cgroupfs
// drivers).
type KubernetesTargetConfig struct {
	// Namespaces lists namespace names.
	Namespaces []string `mapstructure:"namespaces"`
	// NamespaceLabels is a label selector on the labels of the pod's
	// namespace ("team=payments", "env in (prod)"); the namespaces are
	// then watched too.
	NamespaceLabels string `mapstructure:"namespace_labels"`
	// PodLabels is a label selector, as kubectl's -l takes it
	// ("app=checkout,tier in (web,api)").
	PodLabels string `mapstructure:"pod_labels"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// KubernetesConfig says how the receiver reaches the API server when a
// target selects pods.
type KubernetesConfig struct {
	// AuthType: serviceAccount (the pod's own account, in a cluster) or
	// kubeConfig (KUBECONFIG, else ~/.kube/config).
	AuthType string `mapstructure:"auth_type"`
	// NodeName is the node whose pods are watched; empty: the
	// K8S_NODE_NAME environment variable (the chart sets it from
	// spec.nodeName).
	NodeName string `mapstructure:"node_name"`
	// SyncTimeout bounds how long the receiver's start waits for the
	// first list of the node's pods; after it, sampling starts and pods
	// are selected as the watch brings them.
	SyncTimeout time.Duration `mapstructure:"sync_timeout"`

	// prevent unkeyed literal initialization
	_ struct{}
}

const (
	authServiceAccount    = "serviceAccount"
	authKubeConfig        = "kubeConfig"
	defaultK8sSyncTimeout = 10 * time.Second
	nodeNameEnv           = "K8S_NODE_NAME"
	maxK8sSyncTimeout     = 5 * time.Minute
	maxTargetNamespaces   = 256
	maxLabelSelectorSz    = 4096
)

func (k *KubernetesConfig) validate() error {
	var errs []error
	switch k.AuthType {
	case authServiceAccount, authKubeConfig:
	default:
		errs = append(errs, fmt.Errorf("kubernetes.auth_type must be %s or %s, got %q", authServiceAccount, authKubeConfig, k.AuthType))
	}
	if k.SyncTimeout <= 0 || k.SyncTimeout > maxK8sSyncTimeout {
		errs = append(errs, fmt.Errorf("kubernetes.sync_timeout must be above 0 and at most %v, got %v", maxK8sSyncTimeout, k.SyncTimeout))
	}
	return errors.Join(errs...)
}

// node returns the node whose pods are watched.
func (k *KubernetesConfig) node() string {
	if k.NodeName != "" {
		return k.NodeName
	}
	return os.Getenv(nodeNameEnv)
}

// client connects to the API server as AuthType says.
func (k *KubernetesConfig) client() (kubernetes.Interface, error) {
	var rc *rest.Config
	var err error
	switch k.AuthType {
	case authKubeConfig:
		rc, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			clientcmd.NewDefaultClientConfigLoadingRules(), &clientcmd.ConfigOverrides{}).ClientConfig()
	default:
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes (%s): %w", k.AuthType, err)
	}
	rc.UserAgent = "profsym-profiling-receiver"
	return kubernetes.NewForConfig(rc)
}

// podTargets holds the pod selections of the Kubernetes targets of both
// filters (targets, off_cpu.targets) and, once the receiver starts, the
// watch that answers them.
type podTargets struct {
	sels []podsel.Selection
	w    *podsel.Watcher // nil until the receiver is made
}

// add records t's selection and returns the target's pod test.
func (pt *podTargets) add(t *KubernetesTargetConfig) (func(uid string) bool, error) {
	if len(t.Namespaces) > maxTargetNamespaces {
		return nil, fmt.Errorf("namespaces: %d, at most %d", len(t.Namespaces), maxTargetNamespaces)
	}
	for _, ns := range t.Namespaces {
		if ns == "" {
			return nil, errors.New("namespaces: an empty name")
		}
	}
	sel := podsel.Selection{Namespaces: t.Namespaces}
	var err error
	if sel.Labels, err = parseSelector("pod_labels", t.PodLabels); err != nil {
		return nil, err
	}
	if sel.NamespaceLabels, err = parseSelector("namespace_labels", t.NamespaceLabels); err != nil {
		return nil, err
	}
	i := len(pt.sels)
	pt.sels = append(pt.sels, sel)
	return func(uid string) bool { return pt.w != nil && pt.w.Has(i, uid) }, nil
}

// parseSelector parses a label selector of the configuration (nil when
// empty), bounded in size.
func parseSelector(key, text string) (labels.Selector, error) {
	if text == "" {
		return nil, nil
	}
	if len(text) > maxLabelSelectorSz {
		return nil, fmt.Errorf("%s: %d bytes, at most %d", key, len(text), maxLabelSelectorSz)
	}
	sel, err := labels.Parse(text)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	return sel, nil
}

func (pt *podTargets) generation() uint64 {
	if pt.w == nil {
		return 0
	}
	return pt.w.Generation()
}

// watchPods starts the watch of this node's pods for the Kubernetes
// targets, if any, and waits (at most sync_timeout) for the first list:
// the selection in the kernel then starts with the pods already running.
// The watch runs until ctx ends; r.loops waits for it.
func (r *profilingReceiver) watchPods(ctx context.Context) error {
	pt := r.pods
	if pt == nil || len(pt.sels) == 0 {
		return nil
	}
	k := r.cfg.Kubernetes
	node := k.node()
	if node == "" {
		return fmt.Errorf("a target selects Kubernetes pods, but no node is named (kubernetes.node_name, or %s)", nodeNameEnv)
	}
	client, err := k.client()
	if err != nil {
		return err
	}
	pt.w = podsel.New(node, pt.sels, r.log)
	start := time.Now()
	synced, done, err := pt.w.Run(ctx, client, k.SyncTimeout)
	if err != nil {
		return err
	}
	r.loops.Add(1)
	go func() {
		defer r.loops.Done()
		<-done
	}()
	all, selected := pt.w.Pods()
	if !synced {
		r.log.Warn("the node's pods are not listed yet: Kubernetes targets select pods as the watch brings them",
			zap.String("node", node), zap.Duration("waited", time.Since(start)))
		return nil
	}
	r.log.Info("watching the node's pods for Kubernetes targets", zap.String("node", node),
		zap.Int("pods", all), zap.Ints("selected", selected), zap.Duration("took", time.Since(start)))
	return nil
}
