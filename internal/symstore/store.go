// Package symstore keeps the symbols of private binaries by GNU build id,
// for gateways that never see those binaries: agents (and CI) upload the
// sections needed to symbolize, the store verifies them, and serves them
// back over the debuginfod protocol and in process to the symbolization
// processor. It also answers which of a batch of ids it lacks, and hands
// out short upload leases so that many agents discovering one new build id
// upload it once.
package symstore

import (
	"context"
	"crypto/rand"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/buildid"
	"github.com/profsym/profsym/internal/elfx/keepdebug"
	"github.com/profsym/profsym/internal/frame"
)

// Defaults for zero Config fields.
const (
	DefaultMaxUploadBytes = 1 << 30
	DefaultLease          = 2 * time.Minute
	DefaultMaxQueryIDs    = 10_000
	DefaultCacheBytes     = 4 << 30
	DefaultRescan         = time.Minute
	DefaultMaxUploads     = 4
)

// Rejection reasons, as counted and as returned to clients.
const (
	ReasonInvalidBuildID = "invalid_build_id"
	ReasonInvalidKind    = "invalid_kind"
	ReasonTooLarge       = "too_large"
	ReasonNotELF         = "not_elf"
	ReasonMismatch       = "build_id_mismatch"
	ReasonNoSymbols      = "no_symbols"
	ReasonLeaseHeld      = "lease_held"
	ReasonUnauthorized   = "unauthorized"
	ReasonBadRequest     = "bad_request"
	ReasonTruncated      = "truncated"
	ReasonBusy           = "busy"
)

// RejectError is an upload or query the store refused, with the HTTP status
// that says why.
type RejectError struct {
	Reason string
	Status int
	Err    error
}

func (e *RejectError) Error() string { return e.Reason + ": " + e.Err.Error() }
func (e *RejectError) Unwrap() error { return e.Err }

func reject(reason string, status int, err error) *RejectError {
	return &RejectError{Reason: reason, Status: status, Err: err}
}

// Observer receives the store's events, for telemetry.
type Observer interface {
	Rejected(reason string)
	Stored(kind Kind, bytes int64)
	Deduped(kind Kind)
	Served(kind Kind, bytes int64)
	Queried(ids, missing int)
}

type nopObserver struct{}

func (nopObserver) Rejected(string)    {}
func (nopObserver) Stored(Kind, int64) {}
func (nopObserver) Deduped(Kind)       {}
func (nopObserver) Served(Kind, int64) {}
func (nopObserver) Queried(int, int)   {}

// Config configures a Store. Zero fields take the defaults above.
type Config struct {
	Backend Backend
	// ScratchDir holds uploads while they are verified and, for a remote
	// backend, files fetched for in-process symbolization.
	ScratchDir     string
	MaxUploadBytes int64
	// Lease is how long an agent told to upload an id holds it; others are
	// told it is pending meanwhile.
	Lease       time.Duration
	MaxQueryIDs int
	// CacheBytes bounds the local copies of remote objects.
	CacheBytes int64
	// Rescan relists a shared (remote) backend this often, to learn of files
	// other gateways stored.
	Rescan time.Duration
	// MaxUploads bounds uploads received at once, and so the scratch disk
	// they use (MaxUploads x MaxUploadBytes); more get 503 and retry.
	MaxUploads int
	Logger     *zap.Logger
	Observer   Observer
}

// Store is safe for concurrent use.
type Store struct {
	cfg     Config
	be      Backend
	uploads chan struct{}
	log     *zap.Logger
	obs     Observer
	tmp     string

	mu      sync.Mutex
	index   map[string]uint8 // id -> kinds present (bit per kind)
	bytes   int64
	objects int64
	leases  map[string]lease
	// leasesPruned: no pruning before this (the last one freed little).
	leasesPruned time.Time
	listed       time.Time

	gen atomic.Uint64 // bumped whenever files are added

	cacheMu sync.Mutex
	cache   map[string]int64 // local copies of remote files: path -> size
	cached  int64
}

type lease struct {
	token string
	until time.Time
}

func kindBit(k Kind) uint8 {
	if k == Executable {
		return 2
	}
	return 1
}

// New opens a store over a backend and lists what it holds.
func New(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.Backend == nil {
		return nil, errors.New("symstore: no backend")
	}
	if cfg.MaxUploadBytes <= 0 {
		cfg.MaxUploadBytes = DefaultMaxUploadBytes
	}
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.MaxQueryIDs <= 0 {
		cfg.MaxQueryIDs = DefaultMaxQueryIDs
	}
	if cfg.CacheBytes <= 0 {
		cfg.CacheBytes = DefaultCacheBytes
	}
	if cfg.Rescan <= 0 {
		cfg.Rescan = DefaultRescan
	}
	if cfg.MaxUploads <= 0 {
		cfg.MaxUploads = DefaultMaxUploads
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	s := &Store{cfg: cfg, be: cfg.Backend, log: cfg.Logger, obs: cfg.Observer,
		index: map[string]uint8{}, leases: map[string]lease{}, cache: map[string]int64{},
		uploads: make(chan struct{}, cfg.MaxUploads)}
	switch {
	case cfg.ScratchDir != "":
		s.tmp = cfg.ScratchDir
	default:
		if d, ok := cfg.Backend.(*Dir); ok {
			s.tmp = d.TempDir()
		} else {
			s.tmp = filepath.Join(os.TempDir(), "profsym-symstore")
		}
	}
	if err := os.MkdirAll(s.tmp, 0o750); err != nil {
		return nil, fmt.Errorf("symstore: scratch dir: %w", err)
	}
	if err := s.relist(ctx); err != nil {
		return nil, fmt.Errorf("symstore: listing %s: %w", s.be, err)
	}
	return s, nil
}

// relist rebuilds the index from the backend.
func (s *Store) relist(ctx context.Context) error {
	idx := map[string]uint8{}
	var n, b int64
	err := s.be.List(ctx, func(id string, k Kind, size int64) {
		idx[id] |= kindBit(k)
		n++
		b += size
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	grew := n != s.objects
	s.index, s.objects, s.bytes, s.listed = idx, n, b, time.Now()
	s.mu.Unlock()
	if grew {
		s.gen.Add(1)
	}
	return nil
}

// Generation changes whenever the store gains files, so a symbolizer can
// retry frames that failed before an upload.
func (s *Store) Generation() uint64 { return s.gen.Load() }

// Refresh starts relisting a shared backend, in the background, when the
// last listing is older than Rescan: a large bucket must not hold up a
// query or a symbolizer batch. The directory backend is only written by
// this process.
func (s *Store) Refresh(context.Context) {
	if _, local := s.be.(*Dir); local {
		return
	}
	s.mu.Lock()
	stale := time.Since(s.listed) > s.cfg.Rescan
	if stale {
		s.listed = time.Now() // one relist at a time
	}
	s.mu.Unlock()
	if stale {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Rescan)
			defer cancel()
			if err := s.relist(ctx); err != nil {
				s.log.Warn("symbol store: relisting failed", zap.Stringer("backend", s.be), zap.Error(err))
			}
		}()
	}
}

// Size returns the number of stored files and their bytes.
func (s *Store) Size() (objects, bytes int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.objects, s.bytes
}

// Backend returns the store's backend.
func (s *Store) Backend() Backend { return s.be }

// Has reports whether the store holds kind for id.
func (s *Store) Has(id string, kind Kind) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.index[id]&kindBit(kind) != 0
}

// Lease grants an upload.
type Lease struct {
	BuildID string `json:"build_id"`
	Token   string `json:"lease,omitempty"`
}

// MissingResult answers a batch query.
type MissingResult struct {
	// Upload lists the ids the store lacks, each with a lease when one was
	// asked for: the caller should upload these now.
	Upload []Lease `json:"upload"`
	// Pending lists ids it lacks that another client holds a lease on: ask
	// again later.
	Pending []string `json:"pending,omitempty"`
}

// Missing answers which of ids (GNU build ids, hex) the store has no
// debuginfo for. With lease, each missing id not leased to someone else is
// leased to the caller. Ids are validated first: one bad id refuses the
// whole query, since a client sending it is broken or hostile.
func (s *Store) Missing(ids []string, withLease bool) (MissingResult, error) {
	if len(ids) > s.cfg.MaxQueryIDs {
		s.obs.Rejected(ReasonTooLarge)
		return MissingResult{}, reject(ReasonTooLarge, http.StatusRequestEntityTooLarge,
			fmt.Errorf("%d ids in one query, at most %d", len(ids), s.cfg.MaxQueryIDs))
	}
	norm := make([]string, len(ids))
	for i, id := range ids {
		v, err := frame.ParseBuildID(id)
		if err != nil {
			s.obs.Rejected(ReasonInvalidBuildID)
			return MissingResult{}, reject(ReasonInvalidBuildID, http.StatusBadRequest, err)
		}
		norm[i] = v
	}
	var res MissingResult
	now := time.Now()
	s.mu.Lock()
	for _, id := range norm {
		if s.index[id]&kindBit(DebugInfo) != 0 {
			continue
		}
		if !withLease {
			res.Upload = append(res.Upload, Lease{BuildID: id})
			continue
		}
		if l, ok := s.leases[id]; ok && now.Before(l.until) {
			res.Pending = append(res.Pending, id)
			continue
		}
		if len(s.leases) >= s.maxLeases() {
			s.pruneLeases(now)
		}
		if len(s.leases) >= s.maxLeases() {
			// Every agent asking for new ids at once, or one asking for
			// made-up ones: nobody gets a lease until some expire, and the
			// ids are asked about again later.
			res.Pending = append(res.Pending, id)
			continue
		}
		l := lease{token: newToken(), until: now.Add(s.cfg.Lease)}
		s.leases[id] = l
		res.Upload = append(res.Upload, Lease{BuildID: id, Token: l.token})
	}
	s.mu.Unlock()
	s.obs.Queried(len(ids), len(res.Upload)+len(res.Pending))
	return res, nil
}

// maxLeases bounds the leases held at once: ids come from agents, and a
// lease lives for the lease duration whatever the agent does.
func (s *Store) maxLeases() int { return max(8*s.cfg.MaxQueryIDs, 1024) }

// pruneLeases drops expired leases; s.mu is held. It runs only when the
// map is full, and frees at least a quarter of it or waits for a later
// expiry, so that a full map of live leases is not walked per id.
func (s *Store) pruneLeases(now time.Time) {
	if now.Before(s.leasesPruned) {
		return
	}
	for id, l := range s.leases {
		if now.After(l.until) {
			delete(s.leases, id)
		}
	}
	if len(s.leases) > s.maxLeases()*3/4 {
		s.leasesPruned = now.Add(s.cfg.Lease / 8)
	}
}

func newToken() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// PutResult says what an upload did.
type PutResult struct {
	Stored bool  // false: the store already had it (deduplicated)
	Bytes  int64 // bytes received
}

// Put receives an upload of kind for id from body (at most MaxUploadBytes,
// declared is the Content-Length or -1), verifies it and stores it. Nothing
// reaches the backend unless the file is a well-formed ELF file carrying id
// and, for debuginfo, symbols. token is the caller's lease, if any: an
// upload while another client holds the lease is refused.
func (s *Store) Put(ctx context.Context, rawID string, rawKind string, body io.Reader, declared int64, token string) (PutResult, error) {
	var res PutResult
	id, err := frame.ParseBuildID(rawID)
	if err != nil {
		s.obs.Rejected(ReasonInvalidBuildID)
		return res, reject(ReasonInvalidBuildID, http.StatusBadRequest, err)
	}
	kind, ok := ParseKind(rawKind)
	if !ok {
		s.obs.Rejected(ReasonInvalidKind)
		return res, reject(ReasonInvalidKind, http.StatusBadRequest, fmt.Errorf("kind %.40q is not debuginfo or executable", rawKind))
	}
	if declared > s.cfg.MaxUploadBytes {
		s.obs.Rejected(ReasonTooLarge)
		return res, reject(ReasonTooLarge, http.StatusRequestEntityTooLarge,
			fmt.Errorf("%d bytes declared, at most %d", declared, s.cfg.MaxUploadBytes))
	}
	if s.Has(id, kind) || s.statBackend(ctx, id, kind) {
		s.obs.Deduped(kind)
		s.release(id, token)
		return res, nil
	}
	select {
	case s.uploads <- struct{}{}:
		defer func() { <-s.uploads }()
	default:
		s.obs.Rejected(ReasonBusy)
		return res, reject(ReasonBusy, http.StatusServiceUnavailable, fmt.Errorf("%d uploads in progress; retry later", s.cfg.MaxUploads))
	}
	now := time.Now()
	s.mu.Lock()
	if l, ok := s.leases[id]; ok && now.Before(l.until) && l.token != token {
		s.mu.Unlock()
		s.obs.Rejected(ReasonLeaseHeld)
		return res, reject(ReasonLeaseHeld, http.StatusConflict, errors.New("another client is uploading this build id"))
	}
	// Hold the lease for the upload itself, so a client without one that
	// races us is refused rather than writing twice.
	if token == "" {
		token = newToken()
	}
	s.leases[id] = lease{token: token, until: now.Add(s.cfg.Lease)}
	s.mu.Unlock()
	defer s.release(id, token)

	tmp, err := os.CreateTemp(s.tmp, "upload-*")
	if err != nil {
		return res, err
	}
	defer func() {
		tmp.Close()
		os.Remove(tmp.Name()) // a no-op once stored
	}()
	// A large upload at a throttled rate can outlast the lease: keep it
	// while bytes arrive, so nobody else is told to upload meanwhile.
	n, err := io.Copy(tmp, &leaseKeeper{r: io.LimitReader(body, s.cfg.MaxUploadBytes+1), s: s, id: id, token: token})
	res.Bytes = n
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe) || n > s.cfg.MaxUploadBytes:
		s.obs.Rejected(ReasonTooLarge)
		return res, reject(ReasonTooLarge, http.StatusRequestEntityTooLarge, fmt.Errorf("body over %d bytes", s.cfg.MaxUploadBytes))
	case err != nil:
		s.obs.Rejected(ReasonTruncated)
		return res, reject(ReasonTruncated, http.StatusBadRequest, fmt.Errorf("reading body: %w", err))
	case declared >= 0 && n != declared:
		s.obs.Rejected(ReasonTruncated)
		return res, reject(ReasonTruncated, http.StatusBadRequest, fmt.Errorf("got %d of %d bytes", n, declared))
	}
	if err := tmp.Sync(); err != nil {
		return res, err
	}
	if rerr := Verify(tmp.Name(), id, kind); rerr != nil {
		s.obs.Rejected(rerr.Reason)
		return res, rerr
	}
	if err := tmp.Close(); err != nil {
		return res, err
	}
	if err := s.be.Put(ctx, id, kind, tmp.Name(), n); err != nil {
		return res, fmt.Errorf("storing %s/%s in %s: %w", id, kind, s.be, err)
	}
	s.mu.Lock()
	if s.index[id]&kindBit(kind) == 0 {
		s.objects++
		s.bytes += n
	}
	s.index[id] |= kindBit(kind)
	s.mu.Unlock()
	res.Stored = true
	s.gen.Add(1)
	s.obs.Stored(kind, n)
	s.log.Info("symbol store: stored", zap.String("build_id", id), zap.String("kind", string(kind)), zap.Int64("bytes", n))
	return res, nil
}

// statBackend catches files another gateway stored in a shared backend
// since the last listing.
func (s *Store) statBackend(ctx context.Context, id string, kind Kind) bool {
	if _, local := s.be.(*Dir); local {
		return false
	}
	size, err := s.be.Stat(ctx, id, kind)
	if err != nil {
		return false
	}
	s.mu.Lock()
	if s.index[id]&kindBit(kind) == 0 {
		s.index[id] |= kindBit(kind)
		s.objects++
		s.bytes += size
		s.gen.Add(1)
	}
	s.mu.Unlock()
	return true
}

// leaseKeeper extends an upload's lease as its body streams in.
type leaseKeeper struct {
	r         io.Reader
	s         *Store
	id, token string
	last      time.Time
}

func (k *leaseKeeper) Read(p []byte) (int, error) {
	n, err := k.r.Read(p)
	if now := time.Now(); n > 0 && now.Sub(k.last) > k.s.cfg.Lease/4 {
		k.last = now
		k.s.mu.Lock()
		if l, ok := k.s.leases[k.id]; ok && l.token == k.token {
			k.s.leases[k.id] = lease{token: k.token, until: now.Add(k.s.cfg.Lease)}
		}
		k.s.mu.Unlock()
	}
	return n, err
}

func (s *Store) release(id, token string) {
	if token == "" {
		return
	}
	s.mu.Lock()
	if l, ok := s.leases[id]; ok && l.token == token {
		delete(s.leases, id)
	}
	s.mu.Unlock()
}

// Verify checks an uploaded file: a well-formed ELF file whose GNU build id
// is id and, for debuginfo, that carries symbols.
func Verify(path, id string, kind Kind) *RejectError {
	f, err := elfx.Open(path)
	if err != nil {
		return reject(ReasonNotELF, http.StatusUnprocessableEntity, fmt.Errorf("not a well-formed ELF file: %v", err))
	}
	defer f.Close()
	got, err := buildid.GNU(f)
	if err != nil {
		return reject(ReasonMismatch, http.StatusUnprocessableEntity, fmt.Errorf("the file has no GNU build id: %v", err))
	}
	if buildid.HexString(got) != id {
		return reject(ReasonMismatch, http.StatusUnprocessableEntity, fmt.Errorf("the file's build id is %x, not %s", got, id))
	}
	if kind == DebugInfo && !keepdebug.HasSymbols(f) {
		return reject(ReasonNoSymbols, http.StatusUnprocessableEntity, errors.New("the file has no DWARF, .symtab, .gopclntab or .gnu_debugdata"))
	}
	// A forged section table pointing past the end is caught here rather
	// than by every later reader.
	for _, sec := range f.Sections {
		if sec.Type == elf.SHT_NOBITS || sec.Type == elf.SHT_NULL {
			continue
		}
		if end := sec.Offset + sec.FileSize; end < sec.Offset || end > uint64(len(f.Bytes())) {
			return reject(ReasonNotELF, http.StatusUnprocessableEntity, fmt.Errorf("section %.64q lies outside the file (truncated?)", sec.Name))
		}
	}
	return nil
}

// Open returns a stored file for serving.
func (s *Store) Open(ctx context.Context, rawID string, kind Kind) (Object, error) {
	id, err := frame.ParseBuildID(rawID)
	if err != nil {
		return nil, reject(ReasonInvalidBuildID, http.StatusBadRequest, err)
	}
	return s.be.Open(ctx, id, kind)
}

// Locate implements the symbolizer's locator: the debuginfo file for id as
// a local path (fetched into the scratch cache for a remote backend).
// Uploaded debuginfo is returned as the debug file; an uploaded executable
// as the binary.
func (s *Store) Locate(ctx context.Context, rawID string) (binPath, debugPath string, err error) {
	id, err := frame.ParseBuildID(rawID)
	if err != nil {
		return "", "", err
	}
	s.Refresh(ctx)
	if !s.Has(id, DebugInfo) && !s.Has(id, Executable) && !s.statBackend(ctx, id, DebugInfo) {
		return "", "", fmt.Errorf("symbol store has no %s: %w", id, frame.ErrNotFound)
	}
	if s.Has(id, DebugInfo) {
		if debugPath, err = s.local(ctx, id, DebugInfo); err != nil {
			return "", "", err
		}
	}
	if s.Has(id, Executable) {
		if binPath, err = s.local(ctx, id, Executable); err != nil && debugPath == "" {
			return "", "", err
		}
	}
	s.obs.Served(DebugInfo, 0)
	return binPath, debugPath, nil
}

// local returns a path on this host for a stored file.
func (s *Store) local(ctx context.Context, id string, kind Kind) (string, error) {
	if p, ok := s.be.LocalPath(id, kind); ok {
		return p, nil
	}
	dst := filepath.Join(s.tmp, "cache", id, string(kind))
	if st, err := os.Stat(dst); err == nil && st.Mode().IsRegular() {
		return dst, nil
	}
	o, err := s.be.Open(ctx, id, kind)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("%s/%s: %w", id, kind, frame.ErrNotFound)
		}
		return "", fmt.Errorf("%s/%s: %w: %v", id, kind, frame.ErrFetchFailed, err)
	}
	defer o.Close()
	if o.Size() > s.cfg.CacheBytes || o.Size() > s.cfg.MaxUploadBytes {
		return "", fmt.Errorf("%s/%s of %d bytes: %w", id, kind, o.Size(), frame.ErrLimitExceeded)
	}
	s.makeRoom(o.Size())
	if err := os.MkdirAll(filepath.Dir(dst), 0o750); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), "fetch-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	n, err := io.Copy(tmp, io.LimitReader(o, o.Size()+1))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil || n != o.Size() {
		return "", fmt.Errorf("%s/%s: %w: %d of %d bytes: %v", id, kind, frame.ErrFetchFailed, n, o.Size(), err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", err
	}
	s.cacheMu.Lock()
	s.cache[dst] = n
	s.cached += n
	s.cacheMu.Unlock()
	return dst, nil
}

// makeRoom evicts the oldest local copies until n more bytes fit. Files
// still open elsewhere stay readable until closed.
func (s *Store) makeRoom(n int64) {
	s.cacheMu.Lock()
	defer s.cacheMu.Unlock()
	if s.cached+n <= s.cfg.CacheBytes {
		return
	}
	type ent struct {
		p   string
		mod time.Time
	}
	var all []ent
	for p := range s.cache {
		st, err := os.Stat(p)
		if err != nil {
			delete(s.cache, p)
			continue
		}
		all = append(all, ent{p, st.ModTime()})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].mod.Before(all[j].mod) })
	for _, e := range all {
		if s.cached+n <= s.cfg.CacheBytes {
			break
		}
		os.Remove(e.p)
		s.cached -= s.cache[e.p]
		delete(s.cache, e.p)
	}
}
