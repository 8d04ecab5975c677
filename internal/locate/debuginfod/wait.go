package debuginfod

// How callers wait for downloads: a bound per caller (Wait) on a download
// that others may share, and the queue for download slots.

import (
	"context"
	"fmt"
	"time"

	"github.com/profsym/profsym/internal/frame"
)

// Wait bounds how long a caller waits for a download in flight, for callers
// that would rather go on without the file than wait (a batch of a
// pipeline): until For after the earlier of From and the download's start.
// A download this caller starts gets For from From; one started long
// before it costs the caller nothing. The zero Wait waits as long as the
// caller's context.
type Wait struct {
	From time.Time
	For  time.Duration
}

// deadline is when a caller stops waiting for a download started at start
// (zero: no bound but the context).
func (w Wait) deadline(start time.Time) time.Time {
	if w.For <= 0 || w.From.IsZero() {
		return time.Time{}
	}
	from := w.From
	if !start.IsZero() && start.Before(from) {
		from = start
	}
	return from.Add(w.For)
}

// FetchWait is Fetch, waiting at most as w says: past it, the error wraps
// frame.ErrPending and the download goes on, so a later call gets the file.
// A download that cannot start because MaxQueued downloads are running or
// waiting for a server's slot is not started: the caller waits for room as
// long as w allows, then gets ErrPending, and a later call tries again.
func (c *Client) FetchWait(ctx context.Context, buildID string, kind Kind, w Wait) (string, error) {
	id, err := normalizeID(buildID)
	if err != nil {
		return "", err
	}
	if kind != DebugInfo && kind != Executable {
		return "", fmt.Errorf("debuginfod: unknown kind %v", kind)
	}
	k := key(id, kind)
	c.mu.Lock()
	c.st.Requests++
	c.mu.Unlock()
	// queued: this caller holds a place in c.queue, which the download it
	// starts takes over (and gives back when done).
	queued := false
	defer func() {
		if queued {
			<-c.queue
		}
	}()
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return "", fmt.Errorf("debuginfod: client closed: %w", frame.ErrFetchFailed)
		}
		if _, ok := c.files[k]; ok {
			c.mu.Unlock()
			if p, ok := c.hit(k, id, kind); ok {
				return p, nil
			}
			c.mu.Lock()
		}
		if n, ok := c.neg[k]; ok {
			if c.clk.Now().Before(n.until) {
				c.st.NegativeHits++
				c.mu.Unlock()
				return "", fmt.Errorf("%w (remembered until %s)", n.err, n.until.Format(time.TimeOnly))
			}
			delete(c.neg, k)
		}
		if cl, ok := c.inflight[k]; ok {
			c.st.Shared++
			c.mu.Unlock()
			return c.wait(ctx, id, kind, cl, w)
		}
		if !queued {
			select {
			case c.queue <- struct{}{}:
				queued = true
			default:
			}
		}
		if queued {
			cl := &call{done: make(chan struct{}), start: c.clk.Now()}
			c.inflight[k] = cl
			c.wg.Add(1)
			c.mu.Unlock()
			queued = false // run gives the place back
			// Detached from ctx: the result is shared, so one impatient
			// caller must not fail the others or waste a half-done download.
			go c.run(context.WithoutCancel(ctx), k, id, kind, cl)
			return c.wait(ctx, id, kind, cl, w)
		}
		c.mu.Unlock()
		// Every place is taken: wait for one as long as w allows, then
		// look again (another caller may have started this download).
		if err := c.waitQueue(ctx, id, kind, w); err != nil {
			return "", err
		}
		queued = true
	}
}

// wait waits for download cl as w and ctx allow.
func (c *Client) wait(ctx context.Context, id string, kind Kind, cl *call, w Wait) (string, error) {
	var expired <-chan time.Time
	if dl := w.deadline(cl.start); !dl.IsZero() {
		t := c.clk.NewTimer(dl.Sub(c.clk.Now()))
		defer t.Stop()
		expired = t.C()
	}
	select {
	case <-cl.done:
		return cl.path, cl.err
	default:
	}
	select {
	case <-cl.done:
		return cl.path, cl.err
	case <-expired:
		c.abandoned()
		return "", fmt.Errorf("debuginfod %s %s: downloading for %v: %w", id, kind, c.clk.Now().Sub(cl.start).Round(time.Millisecond), frame.ErrPending)
	case <-ctx.Done():
		c.abandoned()
		return "", fmt.Errorf("debuginfod %s %s: downloading for %v: %w: %w", id, kind, c.clk.Now().Sub(cl.start).Round(time.Millisecond), frame.ErrPending, ctx.Err())
	}
}

// waitQueue takes a place in c.queue, waiting as w and ctx allow.
func (c *Client) waitQueue(ctx context.Context, id string, kind Kind, w Wait) error {
	var expired <-chan time.Time
	if dl := w.deadline(time.Time{}); !dl.IsZero() {
		t := c.clk.NewTimer(dl.Sub(c.clk.Now()))
		defer t.Stop()
		expired = t.C()
	}
	select {
	case c.queue <- struct{}{}:
		return nil
	case <-expired:
	case <-ctx.Done():
	}
	c.mu.Lock()
	c.st.Deferred++
	c.mu.Unlock()
	return fmt.Errorf("debuginfod %s %s: not started, %d downloads in flight: %w", id, kind, cap(c.queue), frame.ErrPending)
}

func (c *Client) abandoned() {
	c.mu.Lock()
	c.st.Abandoned++
	c.mu.Unlock()
}
