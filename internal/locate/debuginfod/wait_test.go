package debuginfod

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/clock"
	"github.com/profsym/profsym/internal/frame"
)

// within runs f and fails the test if it has not returned after a minute:
// a hang detector for code that must not wait on its (stopped) clock, not
// a bound on how long it takes.
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatalf("%s never returned", what)
	}
}

// waitRequests waits until srv has had n requests.
func waitRequests(t *testing.T, srv *loopServer, n int64) {
	t.Helper()
	within(t, "the server's requests", func() {
		for srv.reqs.Load() < n {
			time.Sleep(time.Millisecond)
		}
	})
}

// fetchAsync starts c.FetchWait and returns where its error arrives.
func fetchAsync(c *Client, id string, w Wait) <-chan error {
	res := make(chan error, 1)
	go func() {
		_, err := c.FetchWait(context.Background(), id, DebugInfo, w)
		res <- err
	}()
	return res
}

// notYet fails if err has arrived.
func notYet(t *testing.T, res <-chan error, what string) {
	t.Helper()
	select {
	case err := <-res:
		t.Fatalf("%s returned before its time: %v", what, err)
	default:
	}
}

// A caller that cannot wait (a pipeline's batch) gets ErrPending exactly
// when its Wait ends, while the download goes on and serves a later call.
// A caller that finds a download older than its Wait does not wait at all.
func TestFetchWaitPending(t *testing.T) {
	const wait = 200 * time.Millisecond
	t.Run("trickling server", func(t *testing.T) {
		// 16 KiB every 100 ms beats the watchdog: only MaxDownloadTime ends it.
		srv := startLoop(t, endless(16<<10, 100*time.Millisecond))
		clk := clock.NewFake(time.Unix(1_700_000_000, 0))
		c := newClient(t, Config{URLs: []string{srv.URL}, Timeout: 500 * time.Millisecond, MaxDownloadTime: time.Minute, Clock: clk})
		start := clk.Now()
		res := fetchAsync(c, idA, Wait{From: start, For: wait})
		clk.WaitTimersAt(start.Add(wait), 1)
		clk.Advance(wait - time.Nanosecond)
		notYet(t, res, "FetchWait")
		clk.Advance(time.Nanosecond)
		err := <-res
		wantErr(t, err, frame.ErrPending)
		if !strings.Contains(err.Error(), "downloading for 200ms") {
			t.Errorf("first sight: %v, want it to have waited exactly %v", err, wait)
		}
		// Later: the download is older than the wait, so no wait at all
		// (the clock does not move while the call runs).
		clk.Advance(wait)
		within(t, "a later FetchWait", func() {
			_, err = c.FetchWait(context.Background(), idA, DebugInfo, Wait{From: clk.Now(), For: wait})
		})
		wantErr(t, err, frame.ErrPending)
		waitRequests(t, srv, 1)
		st := c.Stats()
		if st.InFlight != 1 || st.OldestInFlight != 2*wait || st.Abandoned != 2 || srv.reqs.Load() != 1 {
			t.Errorf("stats %+v, %d requests", st, srv.reqs.Load())
		}
	})
	t.Run("slow but healthy server", func(t *testing.T) {
		_, _, debugA := split(t, "a", idA)
		files := serveFiles(map[string][]byte{idA + "/debuginfo": read(t, debugA)})
		release := make(chan struct{})
		srv := startLoop(t, func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-release:
			case <-r.Context().Done():
			}
			files(w, r)
		})
		clk := clock.NewFake(time.Unix(1_700_000_000, 0))
		c := newClient(t, Config{URLs: []string{srv.URL}, Timeout: 5 * time.Second, Clock: clk})
		start := clk.Now()
		res := fetchAsync(c, idA, Wait{From: start, For: wait})
		clk.WaitTimersAt(start.Add(wait), 1)
		clk.Advance(wait)
		wantErr(t, <-res, frame.ErrPending)
		// Not remembered as a failure: once there, a patient call has it.
		close(release)
		var p string
		var err error
		within(t, "the download", func() { p, err = c.Fetch(context.Background(), idA, DebugInfo) })
		if err != nil {
			t.Fatal(err)
		}
		if fileID(t, p) != idA {
			t.Fatalf("%s is not %s", p, idA)
		}
		if n := srv.reqs.Load(); n != 1 {
			t.Errorf("%d requests, want 1", n)
		}
		if st := c.Stats(); st.InFlight != 0 || len(st.Errors) != 0 || st.NegativeHits != 0 {
			t.Errorf("stats %+v", st)
		}
	})
	t.Run("zero wait waits for the context", func(t *testing.T) {
		_, _, debugA := split(t, "a", idA)
		files := serveFiles(map[string][]byte{idA + "/debuginfo": read(t, debugA)})
		srv := startLoop(t, func(w http.ResponseWriter, r *http.Request) { pause(r, 2*wait); files(w, r) })
		c := newClient(t, Config{URLs: []string{srv.URL}, Clock: clock.NewFake(time.Unix(1_700_000_000, 0))})
		if _, err := c.FetchWait(context.Background(), idA, DebugInfo, Wait{From: time.Now()}); err != nil {
			t.Fatal(err)
		}
	})
}

// Callers that do not wait for their downloads must not start one per
// build id they are handed: at most MaxQueued downloads are in flight, and
// the rest are not started (ErrPending, nothing remembered) until there is
// room, so a later call starts them.
func TestFetchWaitQueueBound(t *testing.T) {
	const wait, queued = 100 * time.Millisecond, 2
	release := make(chan struct{})
	srv := startLoop(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
		http.NotFound(w, r)
	})
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	c := newClient(t, Config{URLs: []string{srv.URL}, Timeout: 10 * time.Second, MaxParallel: 4, MaxQueued: queued, Clock: clk})
	ids := []string{idA, idB, idC, idD, idE, idF}
	start := clk.Now()
	var wg sync.WaitGroup
	errs := make([]error, len(ids))
	for i, id := range ids {
		wg.Go(func() { _, errs[i] = c.FetchWait(context.Background(), id, DebugInfo, Wait{From: start, For: wait}) })
	}
	// Two wait for their downloads, four for a place: all until start+wait.
	clk.WaitTimersAt(start.Add(wait), len(ids))
	clk.Advance(wait)
	within(t, "the callers", wg.Wait)
	for _, err := range errs {
		wantErr(t, err, frame.ErrPending)
	}
	st := c.Stats()
	if st.InFlight != queued || st.Deferred != int64(len(ids)-queued) {
		t.Errorf("stats %+v: want %d in flight, %d deferred", st, queued, len(ids)-queued)
	}
	waitRequests(t, srv, queued)
	if n := srv.maxConc.Load(); n > queued {
		t.Errorf("%d requests at once, MaxQueued %d", n, queued)
	}
	// The server answers; every id is then asked and answered 404 by later,
	// patient calls.
	close(release)
	for _, id := range ids {
		var err error
		within(t, "Fetch "+id, func() { _, err = c.Fetch(context.Background(), id, DebugInfo) })
		wantErr(t, err, frame.ErrNotFound)
	}
	if n := srv.reqs.Load(); n != int64(len(ids)) {
		t.Errorf("%d requests, want one per id (%d)", n, len(ids))
	}
}
