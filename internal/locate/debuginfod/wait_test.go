package debuginfod

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/frame"
)

// A caller that cannot wait (a pipeline's batch) gets ErrPending once its
// Wait ends, while the download goes on and serves a later call. A caller
// that finds a download older than its Wait does not wait at all.
func TestFetchWaitPending(t *testing.T) {
	const wait = 200 * time.Millisecond
	t.Run("trickling server", func(t *testing.T) {
		// 16 KiB every 100 ms beats the watchdog: only MaxDownloadTime ends it.
		srv := startLoop(t, endless(16<<10, 100*time.Millisecond))
		c := newClient(t, Config{URLs: []string{srv.URL}, Timeout: 500 * time.Millisecond, MaxDownloadTime: time.Minute})
		start := time.Now()
		_, err := c.FetchWait(context.Background(), idA, DebugInfo, Wait{From: start, For: wait})
		took := time.Since(start)
		wantErr(t, err, frame.ErrPending)
		if took < wait-20*time.Millisecond || took > wait+500*time.Millisecond {
			t.Errorf("first sight waited %v, want about %v", took, wait)
		}
		// Later: the download is older than the wait, so no wait at all.
		time.Sleep(wait)
		start = time.Now()
		_, err = c.FetchWait(context.Background(), idA, DebugInfo, Wait{From: start, For: wait})
		wantErr(t, err, frame.ErrPending)
		if took := time.Since(start); took > wait/2 {
			t.Errorf("a later batch waited %v for a download already %v old", took, 2*wait)
		}
		st := c.Stats()
		if st.InFlight != 1 || st.OldestInFlight < 2*wait || st.Abandoned != 2 || srv.reqs.Load() != 1 {
			t.Errorf("stats %+v, %d requests", st, srv.reqs.Load())
		}
	})
	t.Run("slow but healthy server", func(t *testing.T) {
		_, _, debugA := split(t, "a", idA)
		files := serveFiles(map[string][]byte{idA + "/debuginfo": read(t, debugA)})
		srv := startLoop(t, func(w http.ResponseWriter, r *http.Request) { pause(r, 3*wait); files(w, r) })
		c := newClient(t, Config{URLs: []string{srv.URL}, Timeout: 5 * time.Second})
		start := time.Now()
		_, err := c.FetchWait(context.Background(), idA, DebugInfo, Wait{From: start, For: wait})
		wantErr(t, err, frame.ErrPending)
		// Not remembered as a failure: once there, the next call has it.
		deadline := time.Now().Add(10 * time.Second)
		for {
			p, err := c.FetchWait(context.Background(), idA, DebugInfo, Wait{From: time.Now(), For: wait})
			if err == nil {
				if fileID(t, p) != idA {
					t.Fatalf("%s is not %s", p, idA)
				}
				break
			}
			wantErr(t, err, frame.ErrPending)
			if time.Now().After(deadline) {
				t.Fatal("the download never arrived")
			}
			time.Sleep(50 * time.Millisecond)
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
		c := newClient(t, Config{URLs: []string{srv.URL}})
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
	c := newClient(t, Config{URLs: []string{srv.URL}, Timeout: 10 * time.Second, MaxParallel: 4, MaxQueued: queued})
	ids := []string{idA, idB, idC, idD, idE, idF}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, len(ids))
	for i, id := range ids {
		wg.Go(func() { _, errs[i] = c.FetchWait(context.Background(), id, DebugInfo, Wait{From: start, For: wait}) })
	}
	wg.Wait()
	if took := time.Since(start); took > wait+500*time.Millisecond {
		t.Errorf("callers took %v, wait %v", took, wait)
	}
	for i, err := range errs {
		wantErr(t, err, frame.ErrPending)
		_ = i
	}
	st := c.Stats()
	if st.InFlight != queued || st.Deferred != int64(len(ids)-queued) {
		t.Errorf("stats %+v: want %d in flight, %d deferred", st, queued, len(ids)-queued)
	}
	time.Sleep(50 * time.Millisecond)
	if n := srv.maxConc.Load(); n > queued {
		t.Errorf("%d requests at once, MaxQueued %d", n, queued)
	}
	// The server answers; every id is then asked and answered 404 by later calls.
	close(release)
	deadline := time.Now().Add(10 * time.Second)
	for _, id := range ids {
		for {
			_, err := c.FetchWait(context.Background(), id, DebugInfo, Wait{From: time.Now(), For: wait})
			if !frame.Transient(err) {
				wantErr(t, err, frame.ErrNotFound)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %v", id, err)
			}
		}
	}
	if n := srv.reqs.Load(); n != int64(len(ids)) {
		t.Errorf("%d requests, want one per id (%d)", n, len(ids))
	}
}
