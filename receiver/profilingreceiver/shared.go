package profilingreceiver // import "github.com/profsym/profsym/receiver/profilingreceiver"

import (
	"context"
	"sync"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/receiver"
)

// sharedReceivers maps a configuration to the one receiver serving every
// pipeline created from it. The receiver starts with the first pipeline's
// Start and stops when the last pipeline has shut down; then the entry is
// removed, so a new pipeline on the same configuration starts afresh.
type sharedReceivers struct {
	mu sync.Mutex
	m  map[*Config]*sharedEntry
}

type sharedEntry struct {
	r        *profilingReceiver
	users    int
	started  bool
	startErr error
}

func newSharedReceivers() *sharedReceivers {
	return &sharedReceivers{m: map[*Config]*sharedEntry{}}
}

// get returns a handle on cfg's receiver, creating it on first use, after
// letting attach record the pipeline's consumer.
func (s *sharedReceivers) get(cfg *Config, set receiver.Settings, attach func(*profilingReceiver)) (*handle, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[cfg]
	if e == nil {
		r, err := newReceiver(cfg, set)
		if err != nil {
			return nil, err
		}
		e = &sharedEntry{r: r}
		s.m[cfg] = e
	}
	attach(e.r)
	e.users++
	return &handle{s: s, key: cfg, e: e}, nil
}

// handle is what one pipeline holds.
type handle struct {
	s    *sharedReceivers
	key  *Config
	e    *sharedEntry
	done bool
}

func (h *handle) Start(ctx context.Context, host component.Host) error {
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	if !h.e.started {
		h.e.started = true
		h.e.startErr = h.e.r.start(ctx, host)
	}
	return h.e.startErr
}

func (h *handle) Shutdown(ctx context.Context) error {
	h.s.mu.Lock()
	if h.done {
		h.s.mu.Unlock()
		return nil
	}
	h.done = true
	h.e.users--
	last := h.e.users == 0
	if last && h.s.m[h.key] == h.e {
		delete(h.s.m, h.key)
	}
	h.s.mu.Unlock()
	if !last {
		return nil
	}
	return h.e.r.shutdown(ctx)
}
