package profilingreceiver // import "github.com/profsym/profsym/receiver/profilingreceiver"

import (
	"context"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/receiver"

	"github.com/profsym/profsym/internal/sharedcomponent"
)

// A receiver used by both a profiles and a logs pipeline must run one
// sampler, not two: receivers holds the one receiver serving every pipeline
// created from a configuration, the way the collector's own receivers share
// theirs. The receiver starts with the first pipeline's Start and
// stops when the last pipeline has shut down; then it leaves the map, so a
// new pipeline on the same configuration starts afresh.
var receivers = sharedcomponent.NewMap[*Config, *sharedEntry]()

type sharedEntry struct {
	r *profilingReceiver

	mu       sync.Mutex
	started  bool
	startErr error
}

// get returns a handle on cfg's receiver, creating it on first use, after
// letting attach record the pipeline's consumer (the collector creates
// every pipeline before it starts any).
func get(cfg *Config, set receiver.Settings, attach func(*profilingReceiver)) (*handle, error) {
	e, err := receivers.Acquire(cfg, func() (*sharedEntry, error) {
		r, err := newReceiver(cfg, set)
		if err != nil {
			return nil, err
		}
		return &sharedEntry{r: r}, nil
	})
	if err != nil {
		return nil, err
	}
	attach(e.r)
	return &handle{key: cfg, e: e}, nil
}

// handle is what one pipeline holds.
type handle struct {
	key  *Config
	e    *sharedEntry
	done atomic.Bool
}

func (h *handle) Start(ctx context.Context, host component.Host) error {
	h.e.mu.Lock()
	defer h.e.mu.Unlock()
	if !h.e.started {
		h.e.started = true
		h.e.startErr = h.e.r.start(ctx, host)
	}
	return h.e.startErr
}

func (h *handle) Shutdown(ctx context.Context) error {
	if !h.done.CompareAndSwap(false, true) {
		return nil
	}
	if _, last := receivers.Release(h.key); !last {
		return nil
	}
	return h.e.r.shutdown(ctx)
}
