package elfx

import (
	"fmt"
	"sync"

	"github.com/profsym/profsym/internal/frame"
)

// Pool bounds the decompressed section bytes that all the files opened with
// it hold together. Limits.MaxDecompressedBytes bounds one file; a process
// that keeps many files open (a symbolizer's cache, plus the files a batch
// is using) needs a bound on their sum too, or a handful of files that
// each stay just within the per-file limit add up past the memory it has.
//
// A reservation that does not fit first asks the pool's reclaimer (the
// owner of idle files, such as a cache) to close some; if the bytes are
// still held, decompression fails with an error wrapping both
// frame.ErrLimitExceeded and frame.ErrRetry: the file is fine, the memory
// is busy, so the failure is not remembered.
type Pool struct {
	mu      sync.Mutex
	limit   int64
	used    int64
	reclaim func(need int64)
	refused uint64
}

// NewPool makes a pool of limit bytes (limit <= 0: no bound).
func NewPool(limit int64) *Pool { return &Pool{limit: limit} }

// SetReclaim sets the function asked to free at least need bytes when a
// reservation does not fit. It must not decompress anything itself.
func (p *Pool) SetReclaim(f func(need int64)) {
	p.mu.Lock()
	p.reclaim = f
	p.mu.Unlock()
}

// Stats reports the bytes held, the bound, and how many reservations were
// refused.
func (p *Pool) Stats() (used, limit int64, refused uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.used, p.limit, p.refused
}

// fits reports whether n more bytes fit now; p.mu is held.
func (p *Pool) fits(n int64) bool { return p.limit <= 0 || p.used+n <= p.limit }

// take reserves n bytes.
func (p *Pool) take(n int64) error {
	if p == nil || n <= 0 {
		return nil
	}
	p.mu.Lock()
	if p.fits(n) {
		p.used += n
		p.mu.Unlock()
		return nil
	}
	need, reclaim := p.used+n-p.limit, p.reclaim
	p.mu.Unlock()
	if reclaim != nil {
		reclaim(need)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fits(n) {
		p.used += n
		return nil
	}
	p.refused++
	return fmt.Errorf("decompressing needs %d bytes more, but the %d bytes that open files may hold together are in use: %w (%w)",
		n, p.limit, frame.ErrLimitExceeded, frame.ErrRetry)
}

// force charges n bytes whether they fit or not (a buffer that came out a
// little larger than reserved).
func (p *Pool) force(n int64) {
	if p == nil || n <= 0 {
		return
	}
	p.mu.Lock()
	p.used += n
	p.mu.Unlock()
}

// give returns n bytes.
func (p *Pool) give(n int64) {
	if p == nil || n <= 0 {
		return
	}
	p.mu.Lock()
	p.used -= n
	p.mu.Unlock()
}
