// Package symupload runs on the agent: it notices build ids of mapped files
// that carry symbols on this host, asks the gateway's symbol store which it
// lacks (one batched query per round), and uploads only those, as the
// sections needed to symbolize, extracted and compressed
// (internal/elfx/keepdebug), with bounded bandwidth and concurrency and
// retries with backoff. Nothing here blocks the caller: Observe only
// queues, and a gateway that is down only delays symbols.
package symupload

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/keepdebug"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/symstore"
)

// Defaults for zero Config fields.
const (
	DefaultQueryInterval  = 5 * time.Second
	DefaultInitialBackoff = 5 * time.Second
	DefaultMaxBackoff     = 5 * time.Minute
	DefaultMaxConcurrent  = 2
	DefaultMaxFileBytes   = 2 << 30
	DefaultMaxTracked     = 1 << 16
	// maxBatch bounds the ids of one missing query.
	maxBatch = 1000
	// maxCandidates is how many (pid, path) sightings are kept per id, to
	// find the file again if the first process exits.
	maxCandidates = 4
	// maxNotFound is how many rounds an id whose file cannot be opened (its
	// processes exited) is kept.
	maxNotFound = 3
	// queryTimeout bounds one missing query; uploadTimeout plus a second per
	// minUploadRate bytes bounds one upload.
	queryTimeout  = 30 * time.Second
	uploadTimeout = 2 * time.Minute
	minUploadRate = 64 << 10
)

// Config configures an Uploader.
type Config struct {
	Client    *symstore.Client
	DebugDirs []string
	// Exclude are globs over the mapping's path: "*" and "?" within a path
	// element as filepath.Match, "/**" at the end for a whole tree; a
	// pattern without "/" matches the file's base name.
	Exclude        []string
	MaxConcurrent  int
	MaxFileBytes   int64
	QueryInterval  time.Duration
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	Compression    keepdebug.Compression
	ScratchDir     string
	MaxTracked     int
	ProcRoot       string // "/proc" unless testing
	Logger         *zap.Logger
	Observer       Observer
}

// Observer receives the uploader's events, for telemetry.
type Observer interface {
	Attempted()
	Stored(bytes int64)
	Deduped() // the store had it, or another agent uploaded it
	Failed(reason string)
	Skipped(reason string) // excluded, no symbols on this host, ...
}

type nopObserver struct{}

func (nopObserver) Attempted()     {}
func (nopObserver) Stored(int64)   {}
func (nopObserver) Deduped()       {}
func (nopObserver) Failed(string)  {}
func (nopObserver) Skipped(string) {}

type state int

const (
	queued  state = iota // waiting for its next round
	running              // being resolved or uploaded
	done                 // stored, present, or given up on
)

type entry struct {
	state    state
	cands    []Candidate
	src      *Source
	attempts int
	notFound int
	next     time.Time
}

// Uploader is safe for concurrent use.
type Uploader struct {
	cfg Config
	log *zap.Logger
	obs Observer
	sem chan struct{}

	mu      sync.Mutex
	ids     map[string]*entry
	wake    chan struct{}
	stop    context.CancelFunc
	ctx     context.Context
	wg      sync.WaitGroup
	started bool
}

// New makes an Uploader; Start runs it.
func New(cfg Config) *Uploader {
	if cfg.QueryInterval <= 0 {
		cfg.QueryInterval = DefaultQueryInterval
	}
	if cfg.InitialBackoff <= 0 {
		cfg.InitialBackoff = DefaultInitialBackoff
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = DefaultMaxConcurrent
	}
	if cfg.MaxFileBytes <= 0 {
		cfg.MaxFileBytes = DefaultMaxFileBytes
	}
	if cfg.MaxTracked <= 0 {
		cfg.MaxTracked = DefaultMaxTracked
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.ScratchDir == "" {
		cfg.ScratchDir = os.TempDir()
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	return &Uploader{cfg: cfg, log: cfg.Logger, obs: cfg.Observer, sem: make(chan struct{}, cfg.MaxConcurrent),
		ids: map[string]*entry{}, wake: make(chan struct{}, 1)}
}

// Start runs the upload loop until Stop.
func (u *Uploader) Start() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.started {
		return
	}
	u.started = true
	u.ctx, u.stop = context.WithCancel(context.Background())
	u.wg.Add(1)
	go u.loop()
}

// Stop ends the loop and waits for uploads in flight to give up.
func (u *Uploader) Stop() {
	u.mu.Lock()
	stop := u.stop
	u.mu.Unlock()
	if stop != nil {
		stop()
	}
	u.wg.Wait()
}

// Excluded reports whether path matches an exclude glob.
func (u *Uploader) Excluded(path string) bool {
	for _, g := range u.cfg.Exclude {
		if matchGlob(g, path) {
			return true
		}
	}
	return false
}

func matchGlob(g, p string) bool {
	if tree, ok := strings.CutSuffix(g, "/**"); ok {
		return p == tree || strings.HasPrefix(p, tree+"/")
	}
	if !strings.Contains(g, "/") {
		ok, _ := filepath.Match(g, filepath.Base(p))
		return ok
	}
	ok, _ := filepath.Match(g, p)
	return ok
}

// Known reports whether id (a key in its String form: a GNU build id in
// hex, or "gobuildid/HEX") is tracked already; callers skip the work of
// building a Candidate for ids seen before.
func (u *Uploader) Known(id string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	e, ok := u.ids[id]
	return ok && (e.state == done || len(e.cands) >= maxCandidates)
}

// Observe queues a candidate. It never blocks on I/O.
func (u *Uploader) Observe(c Candidate) {
	key, err := c.Key()
	if err != nil {
		return
	}
	id := key.String()
	if u.Excluded(c.Path) {
		u.mu.Lock()
		if _, ok := u.ids[id]; !ok {
			// Remembered only to count it once; within the same bound.
			if len(u.ids) >= u.cfg.MaxTracked {
				u.forgetDone()
			}
			if len(u.ids) < u.cfg.MaxTracked {
				u.ids[id] = &entry{state: done}
			}
			u.mu.Unlock()
			u.obs.Skipped("excluded")
			return
		}
		u.mu.Unlock()
		return
	}
	u.mu.Lock()
	e, ok := u.ids[id]
	if !ok {
		if len(u.ids) >= u.cfg.MaxTracked {
			u.forgetDone()
			if len(u.ids) >= u.cfg.MaxTracked {
				u.mu.Unlock()
				u.obs.Skipped("too_many_pending")
				return
			}
		}
		e = &entry{state: queued}
		u.ids[id] = e
		select {
		case u.wake <- struct{}{}:
		default:
		}
	}
	if e.state != done && len(e.cands) < maxCandidates {
		e.cands = append(e.cands, c)
	}
	u.mu.Unlock()
}

// forgetDone drops finished ids so the table stays bounded; a forgotten id
// seen again is asked about again, which the store answers cheaply.
func (u *Uploader) forgetDone() {
	for id, e := range u.ids {
		if e.state == done {
			delete(u.ids, id)
		}
	}
}

func (u *Uploader) loop() {
	defer u.wg.Done()
	t := time.NewTicker(u.cfg.QueryInterval)
	defer t.Stop()
	// A short settle time batches the ids of one profile into one query.
	settle := time.NewTimer(time.Hour)
	settle.Stop()
	for {
		select {
		case <-u.ctx.Done():
			return
		case <-u.wake:
			settle.Reset(200 * time.Millisecond)
			continue
		case <-settle.C:
		case <-t.C:
		}
		u.round(u.ctx)
	}
}

// round resolves the ids due, asks the store about those with symbols, and
// starts the uploads it leases to us.
func (u *Uploader) round(ctx context.Context) {
	now := time.Now()
	var due []string
	u.mu.Lock()
	for id, e := range u.ids {
		if e.state == queued && !now.Before(e.next) && len(due) < maxBatch {
			e.state = running
			due = append(due, id)
		}
	}
	u.mu.Unlock()
	if len(due) == 0 {
		return
	}
	var ask []string
	for _, id := range due {
		if u.resolve(id) {
			ask = append(ask, id)
		}
	}
	if len(ask) == 0 {
		return
	}
	qctx, cancel := context.WithTimeout(ctx, queryTimeout)
	res, err := u.cfg.Client.Missing(qctx, ask)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		u.log.Debug("symbol upload: store unreachable; retrying later", zap.Error(err), zap.Int("ids", len(ask)))
		u.obs.Failed(reasonOf(err))
		for _, id := range ask {
			u.retry(id, symstore.IsPermanent(err))
		}
		return
	}
	leased := map[string]string{}
	for _, l := range res.Upload {
		leased[l.BuildID] = l.Token
	}
	pending := map[string]bool{}
	for _, id := range res.Pending {
		pending[id] = true
	}
	lease := time.Duration(res.LeaseSeconds) * time.Second
	for _, id := range ask {
		switch tok, ok := leased[id]; {
		case ok:
			u.wg.Add(1)
			go u.upload(ctx, id, tok, lease)
		case pending[id]:
			// Another agent is uploading it: ask again next round.
			u.requeue(id, u.cfg.QueryInterval)
		default:
			u.obs.Deduped()
			u.finish(id)
		}
	}
}

// resolve finds the file to upload for id; false when there is none (yet).
func (u *Uploader) resolve(id string) bool {
	u.mu.Lock()
	e := u.ids[id]
	cands := append([]Candidate(nil), e.cands...)
	have := e.src != nil
	u.mu.Unlock()
	if have {
		return true
	}
	var lastErr error
	if len(cands) == 0 {
		// fileGone dropped the sightings and no process mapped the file
		// since: nothing to open is the file gone, not a reason-less skip.
		lastErr = fmt.Errorf("build id %s: no sighting left to open: %w", id, frame.ErrNotFound)
	}
	for _, c := range cands {
		src, err := FindSource(u.cfg.ProcRoot, c, u.cfg.DebugDirs)
		if err != nil {
			lastErr = err
			continue
		}
		if src.Size > u.cfg.MaxFileBytes {
			u.obs.Skipped("too_large")
			u.log.Info("symbol upload: file over max_file_size; not uploaded", zap.String("path", src.Path), zap.Int64("bytes", src.Size))
			u.finish(id)
			return false
		}
		u.mu.Lock()
		e.src = &src
		u.mu.Unlock()
		return true
	}
	switch {
	case errors.Is(lastErr, frame.ErrNotFound):
		u.fileGone(id)
	default:
		u.obs.Skipped(frame.Reason(lastErr))
		u.log.Debug("symbol upload: nothing to upload", zap.String("build_id", id), zap.Error(lastErr))
		u.finish(id)
	}
	return false
}

func (u *Uploader) upload(ctx context.Context, id, lease string, leaseFor time.Duration) {
	defer u.wg.Done()
	select {
	case u.sem <- struct{}{}:
	case <-ctx.Done():
		return
	}
	defer func() { <-u.sem }()
	u.mu.Lock()
	src := *u.ids[id].src
	u.mu.Unlock()
	u.obs.Attempted()
	tmp, size, gone, err := u.extractLeased(ctx, id, lease, leaseFor, src)
	switch {
	case err != nil && ctx.Err() != nil:
		return // stopping
	case gone == leaseStored:
		if err == nil {
			os.Remove(tmp)
		}
		u.obs.Deduped()
		u.finish(id)
		return
	case gone == leaseLost:
		if err == nil {
			os.Remove(tmp)
		}
		u.requeue(id, u.cfg.QueryInterval) // another agent is uploading it now
		return
	case err != nil && isGone(err):
		// The process exited between the sighting and the upload (its
		// /proc/PID/map_files went with it): routine for short-lived
		// processes, so not worth an info line. Another process may still
		// run the file.
		u.log.Debug("symbol upload: the file went away before extraction", zap.String("path", src.Path), zap.Error(err))
		u.mu.Lock()
		u.ids[id].src = nil
		u.mu.Unlock()
		u.fileGone(id)
		return
	case err != nil:
		u.log.Info("symbol upload: extraction failed", zap.String("path", src.Path), zap.Error(err))
		u.obs.Failed("extract")
		u.finish(id)
		return
	}
	defer os.Remove(tmp)
	// A hung connection must not hold a slot forever; a throttled upload
	// of a large file legitimately takes long.
	uctx, cancel := context.WithTimeout(ctx, uploadTimeout+time.Duration(size/minUploadRate)*time.Second)
	defer cancel()
	stored, err := u.cfg.Client.Upload(uctx, id, symstore.DebugInfo, tmp, lease)
	switch {
	case err == nil && stored:
		u.obs.Stored(size)
		u.log.Info("symbol upload: uploaded", zap.String("build_id", id), zap.String("binary", src.Binary),
			zap.String("from", src.Path), zap.Int64("bytes", size))
		u.finish(id)
	case err == nil:
		u.obs.Deduped()
		u.finish(id)
	case ctx.Err() != nil:
	default:
		u.obs.Failed(reasonOf(err))
		u.log.Info("symbol upload failed", zap.String("build_id", id), zap.Error(err))
		u.retry(id, symstore.IsPermanent(err))
	}
}

// fileGone notes that no file of id could be opened (its processes
// exited): it is looked for again with the next sightings, and given up
// after maxNotFound rounds.
func (u *Uploader) fileGone(id string) {
	u.mu.Lock()
	e := u.ids[id]
	e.notFound++
	gone := e.notFound >= maxNotFound
	e.cands = nil // new sightings bring live processes
	u.mu.Unlock()
	if gone {
		u.obs.Skipped("file_gone")
		u.finish(id)
	} else {
		u.requeue(id, u.cfg.QueryInterval)
	}
}

// isGone reports whether err means the file or its process no longer
// exists (ENOENT from /proc/PID/map_files/..., ESRCH).
func isGone(err error) bool {
	return errors.Is(err, frame.ErrNotFound) || errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH)
}

// Why a lease ended before its upload started.
const (
	leaseKept   = iota
	leaseStored // the store has the id (another agent uploaded it)
	leaseLost   // another agent holds the lease now
)

// extractLeased extracts src while renewing the lease on id, which a paced
// extraction of a large file can outlast. When the store answers that the
// lease is gone, the extraction stops and says why.
func (u *Uploader) extractLeased(ctx context.Context, id, lease string, leaseFor time.Duration, src Source) (string, int64, int, error) {
	ectx, cancel := context.WithCancel(ctx)
	defer cancel()
	gone := leaseKept
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		t := time.NewTicker(max(leaseFor/3, time.Second))
		defer t.Stop()
		for {
			select {
			case <-ectx.Done():
				return
			case <-t.C:
			}
			rctx, rcancel := context.WithTimeout(ectx, queryTimeout)
			held, present, err := u.cfg.Client.Renew(rctx, id, lease)
			rcancel()
			if err != nil || held {
				continue // unreachable: the upload finds out
			}
			gone = leaseLost
			if present {
				gone = leaseStored
			}
			cancel()
			return
		}
	}()
	tmp, size, err := u.extract(ectx, src)
	cancel()
	<-renewed
	return tmp, size, gone, err
}

// extract writes the symbol sections of src to a scratch file. Its CPU is
// kept off the sampled host's back twice over: the input is paced through
// the client's limiter (max_bandwidth: the agent reads at most that many
// bytes of symbols a second, and sends at most that many), and the work
// runs on a thread at nice 19.
func (u *Uploader) extract(ctx context.Context, src Source) (string, int64, error) {
	var path string
	var size int64
	err := lowPriority(func() error {
		var err error
		path, size, err = u.extractNow(ctx, src)
		return err
	})
	return path, size, err
}

func (u *Uploader) extractNow(ctx context.Context, src Source) (string, int64, error) {
	f, err := elfx.Open(src.Path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	out, err := os.CreateTemp(u.cfg.ScratchDir, "profsym-upload-*.debug")
	if err != nil {
		return "", 0, err
	}
	opt := keepdebug.Options{Compression: u.cfg.Compression, Extra: splitSections(src, f)}
	if l := u.cfg.Client.Limiter; l != nil {
		opt.Pace = func(n int) error { return l.Wait(ctx, n) }
	}
	st, err := keepdebug.WriteOptions(f, out, opt)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(out.Name())
		return "", 0, err
	}
	return out.Name(), st.OutBytes, nil
}

func (u *Uploader) finish(id string) {
	u.mu.Lock()
	if e := u.ids[id]; e != nil {
		e.state, e.src, e.cands = done, nil, nil
	}
	u.mu.Unlock()
}

func (u *Uploader) requeue(id string, after time.Duration) {
	u.mu.Lock()
	if e := u.ids[id]; e != nil {
		e.state, e.next = queued, time.Now().Add(after)
	}
	u.mu.Unlock()
}

// retry backs off exponentially; a permanent refusal is not retried.
func (u *Uploader) retry(id string, permanent bool) {
	if permanent {
		u.finish(id)
		return
	}
	u.mu.Lock()
	e := u.ids[id]
	if e == nil {
		u.mu.Unlock()
		return
	}
	e.attempts++
	d := u.cfg.InitialBackoff << min(e.attempts-1, 16)
	if d > u.cfg.MaxBackoff || d <= 0 {
		d = u.cfg.MaxBackoff
	}
	e.state, e.next = queued, time.Now().Add(d)
	u.mu.Unlock()
}

// Stats returns how many ids are tracked, by state.
func (u *Uploader) Stats() (queuedN, runningN, doneN int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, e := range u.ids {
		switch e.state {
		case queued:
			queuedN++
		case running:
			runningN++
		case done:
			doneN++
		}
	}
	return
}

func reasonOf(err error) string {
	var se *symstore.StatusError
	if errors.As(err, &se) {
		if se.Reason != "" {
			return se.Reason
		}
		return fmt.Sprintf("http_%d", se.Status)
	}
	return "unreachable"
}
