// Package symstore keeps the symbols of private binaries by GNU build id
// (or, for Go binaries without one, by Go build id), for gateways that
// never see those binaries: agents (and CI) upload the sections needed to
// symbolize, the store verifies them, and serves them back over the
// debuginfod protocol and in process to the symbolization processor. It
// also answers which of a batch of ids it lacks, and hands out short upload
// leases so that many agents discovering one new build id upload it once;
// over a shared bucket the leases live in the bucket, so gateway replicas
// hand each one out once too.
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
	"golang.org/x/sync/singleflight"

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
	// DefaultMaxStoredBytes and DefaultMaxObjects bound what uploads can
	// fill: the disk or bucket, and the index kept in memory (about 100
	// bytes an object).
	DefaultMaxStoredBytes = 16 << 30
	DefaultMaxObjects     = 500_000
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
	ReasonStoreFull      = "store_full"
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
	// MaxStoredBytes and MaxObjects bound the store: an upload that would
	// pass either is refused (507) and counted as store_full, so an agent
	// with the token cannot fill the disk or the index. Nothing is evicted:
	// the operator frees space or raises the limit.
	MaxStoredBytes int64
	MaxObjects     int64
	// FetchTimeout bounds one copy of a remote file into the scratch cache.
	// The copy runs apart from the caller, which may stop waiting sooner, so
	// a large file is fetched once rather than restarted by every batch.
	FetchTimeout time.Duration
	Logger       *zap.Logger
	Observer     Observer
}

// DefaultFetchTimeout bounds one remote copy into the scratch cache.
const DefaultFetchTimeout = 5 * time.Minute

// SharedLeases is implemented by a backend that several stores share (a
// bucket behind gateway replicas) and that can hold upload leases itself,
// with conditional writes: each lease is then handed out once across all
// the stores, not once per store.
type SharedLeases interface {
	// LeasesShared reports whether the backend holds leases (it supports
	// the conditional writes they need); false: the store keeps them in
	// memory.
	LeasesShared() bool
	// AcquireLease gives key's lease to token for ttl, unless another token
	// holds one that has not expired. It reports whether token holds it
	// now (a holder acquiring again extends it).
	AcquireLease(ctx context.Context, key Key, token string, ttl time.Duration) (bool, error)
	// ExtendLease moves token's lease on key to ttl from now; false when
	// token no longer holds it.
	ExtendLease(ctx context.Context, key Key, token string, ttl time.Duration) (bool, error)
	// ReleaseLease drops token's lease on key, if token still holds it.
	ReleaseLease(ctx context.Context, key Key, token string) error
}

// Store is safe for concurrent use.
type Store struct {
	cfg     Config
	be      Backend
	uploads chan struct{}
	log     *zap.Logger
	obs     Observer
	tmp     string

	shared SharedLeases // nil: leases in memory (leases below)

	mu      sync.Mutex
	index   map[Key]uint8 // key -> kinds present (bit per kind)
	bytes   int64
	objects int64
	// reserved and reservedObjects: uploads read and verified, being
	// written to the backend, counted against the limits.
	reserved        int64
	reservedObjects int64
	leases          map[Key]lease
	// leasesPruned: no pruning before this (the last one freed little).
	leasesPruned time.Time
	listed       time.Time
	fullLogged   bool // warned once that the store is full

	fetches singleflight.Group // copies of remote files into the cache

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
	if cfg.FetchTimeout <= 0 {
		cfg.FetchTimeout = DefaultFetchTimeout
	}
	if cfg.MaxStoredBytes <= 0 {
		cfg.MaxStoredBytes = DefaultMaxStoredBytes
	}
	if cfg.MaxObjects <= 0 {
		cfg.MaxObjects = DefaultMaxObjects
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	s := &Store{cfg: cfg, be: cfg.Backend, log: cfg.Logger, obs: cfg.Observer,
		index: map[Key]uint8{}, leases: map[Key]lease{}, cache: map[string]int64{},
		uploads: make(chan struct{}, cfg.MaxUploads)}
	if sl, ok := cfg.Backend.(SharedLeases); ok && sl.LeasesShared() {
		s.shared = sl
	}
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
	if w, ok := s.be.(Watcher); ok {
		// A first answer to compare later ones with; an owner that is down
		// now only delays symbols.
		if _, err := w.Changed(ctx); err != nil {
			s.log.Warn("symbol store: the remote store does not answer yet", zap.Stringer("backend", s.be), zap.Error(err))
		}
	}
	return s, nil
}

// relist rebuilds the index from the backend.
func (s *Store) relist(ctx context.Context) error {
	idx := map[Key]uint8{}
	var n, b int64
	err := s.be.List(ctx, func(key Key, k Kind, size int64) {
		idx[key] |= kindBit(k)
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

// Watcher is a backend that another process fills and that says cheaply
// whether it changed (a store read over HTTP): the store polls it instead
// of listing it.
type Watcher interface {
	Changed(ctx context.Context) (bool, error)
}

// Refresh starts relisting a shared backend, in the background, when the
// last listing is older than Rescan: a large bucket must not hold up a
// query or a symbolizer batch. A watched backend is polled instead, and its
// changes move the generation. The directory backend is only written by
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
	if !stale {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Rescan)
		defer cancel()
		if w, ok := s.be.(Watcher); ok {
			changed, err := w.Changed(ctx)
			if err != nil {
				s.log.Warn("symbol store: polling the remote store failed", zap.Stringer("backend", s.be), zap.Error(err))
			}
			if changed {
				s.gen.Add(1)
			}
			return
		}
		if err := s.relist(ctx); err != nil {
			s.log.Warn("symbol store: relisting failed", zap.Stringer("backend", s.be), zap.Error(err))
		}
	}()
}

// Size returns the number of stored files and their bytes.
func (s *Store) Size() (objects, bytes int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.objects, s.bytes
}

// Backend returns the store's backend.
func (s *Store) Backend() Backend { return s.be }

// LeasesShared reports whether upload leases live in the backend (shared
// by every store over it) rather than in this store's memory.
func (s *Store) LeasesShared() bool { return s.shared != nil }

// Has reports whether the store holds kind for key (a GNU build id in hex,
// or "gobuildid/HEX"); false for a malformed key.
func (s *Store) Has(rawKey string, kind Kind) bool {
	key, err := ParseKey(rawKey)
	return err == nil && s.has(key, kind)
}

func (s *Store) has(key Key, kind Kind) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.index[key]&kindBit(kind) != 0
}

// Lease grants an upload. BuildID is the key as asked: a GNU build id in
// hex, or "gobuildid/HEX".
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
	// LeaseSeconds is how long a lease lasts unless renewed (by asking
	// again with it in MissingRequest.Held) or kept by an upload streaming.
	LeaseSeconds int `json:"lease_seconds,omitempty"`
}

// maxLeaseCalls bounds the backend calls one missing query makes at once
// when leases live in the backend.
const maxLeaseCalls = 8

// Missing answers which of ids (keys: GNU build ids in hex, or
// "gobuildid/HEX") the store has no debuginfo for. With lease, each
// missing id not leased to someone else is leased to the caller. Ids are
// validated first: one bad id refuses the whole query, since a client
// sending it is broken or hostile. Answers use the canonical form of each
// id (lowercase).
func (s *Store) Missing(ctx context.Context, ids []string, withLease bool) (MissingResult, error) {
	return s.Query(ctx, MissingRequest{BuildIDs: ids, Lease: withLease})
}

// maxTokenLen bounds a lease token sent back in a query.
const maxTokenLen = 64

// Query is Missing for a whole request: ids in req.Held whose lease the
// caller still holds (or that nobody else took meanwhile) are leased to it
// again under the same token, for another lease duration. An agent renews
// its leases this way while it extracts a large file.
func (s *Store) Query(ctx context.Context, req MissingRequest) (MissingResult, error) {
	ids, withLease := req.BuildIDs, req.Lease
	if len(ids) > s.cfg.MaxQueryIDs || len(req.Held) > len(ids) {
		s.obs.Rejected(ReasonTooLarge)
		return MissingResult{}, reject(ReasonTooLarge, http.StatusRequestEntityTooLarge,
			fmt.Errorf("%d ids (%d held) in one query, at most %d", len(ids), len(req.Held), s.cfg.MaxQueryIDs))
	}
	keys := make([]Key, len(ids))
	for i, id := range ids {
		k, err := ParseKey(id)
		if err != nil {
			s.obs.Rejected(ReasonInvalidBuildID)
			return MissingResult{}, reject(ReasonInvalidBuildID, http.StatusBadRequest, err)
		}
		keys[i] = k
	}
	held := map[Key]string{}
	for id, tok := range req.Held {
		k, err := ParseKey(id)
		if err != nil || tok == "" || len(tok) > maxTokenLen {
			s.obs.Rejected(ReasonBadRequest)
			return MissingResult{}, reject(ReasonBadRequest, http.StatusBadRequest, fmt.Errorf("held lease %.80q: not an id and a token", id))
		}
		held[k] = tok
	}
	res := MissingResult{LeaseSeconds: int(s.cfg.Lease / time.Second)}
	var ask []Key // missing from the index, for the shared leases
	seen := make(map[Key]bool, len(keys))
	now := time.Now()
	s.mu.Lock()
	for _, k := range keys {
		if s.index[k]&kindBit(DebugInfo) != 0 {
			continue
		}
		switch {
		case !withLease:
			res.Upload = append(res.Upload, Lease{BuildID: k.String()})
		case seen[k]:
			res.Pending = append(res.Pending, k.String()) // the same id twice: one lease
		case s.shared != nil:
			ask = append(ask, k)
		default:
			tok, renew := held[k]
			l, ok := s.leases[k]
			if ok && now.Before(l.until) && (!renew || l.token != tok) {
				res.Pending = append(res.Pending, k.String())
				break
			}
			if !ok && len(s.leases) >= s.maxLeases() {
				s.pruneLeases(now)
			}
			if !ok && len(s.leases) >= s.maxLeases() {
				// Every agent asking for new ids at once, or one asking for
				// made-up ones: nobody gets a lease until some expire, and
				// the ids are asked about again later.
				res.Pending = append(res.Pending, k.String())
				break
			}
			if !renew {
				tok = newToken()
			}
			s.leases[k] = lease{token: tok, until: now.Add(s.cfg.Lease)}
			res.Upload = append(res.Upload, Lease{BuildID: k.String(), Token: tok})
		}
		seen[k] = true
	}
	s.mu.Unlock()
	if len(ask) > 0 {
		up, pend, err := s.leaseShared(ctx, ask, held)
		if err != nil {
			return MissingResult{}, err
		}
		res.Upload = append(res.Upload, up...)
		res.Pending = append(res.Pending, pend...)
	}
	s.obs.Queried(len(ids), len(res.Upload)+len(res.Pending))
	return res, nil
}

// leaseShared asks the backend, for keys this store does not list: stored
// since the last listing (by another replica), leased to the caller now, or
// held by someone else.
func (s *Store) leaseShared(ctx context.Context, keys []Key, held map[Key]string) (upload []Lease, pending []string, err error) {
	type answer struct {
		lease   Lease
		pending bool
		present bool
		err     error
	}
	answers := make([]answer, len(keys))
	sem := make(chan struct{}, maxLeaseCalls)
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if s.statBackend(ctx, k, DebugInfo) {
				answers[i].present = true
				return
			}
			tok, renew := held[k]
			if !renew {
				tok = newToken()
			}
			ok, err := s.shared.AcquireLease(ctx, k, tok, s.cfg.Lease)
			switch {
			case err != nil:
				answers[i].err = err
			case ok:
				answers[i].lease = Lease{BuildID: k.String(), Token: tok}
			default:
				answers[i].pending = true
			}
		}()
	}
	wg.Wait()
	for i, a := range answers {
		switch {
		case a.err != nil:
			// Leases handed out in this query expire unused: the caller
			// retries the whole query later.
			return nil, nil, fmt.Errorf("leasing %s in %s: %w", keys[i], s.be, a.err)
		case a.present:
		case a.pending:
			pending = append(pending, keys[i].String())
		default:
			upload = append(upload, a.lease)
		}
	}
	return upload, pending, nil
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

// Put receives an upload of kind for a key (a GNU build id in hex, or
// "gobuildid/HEX") from body (at most MaxUploadBytes, declared is the
// Content-Length or -1), verifies it and stores it. Nothing reaches the
// backend unless the file is a well-formed ELF file carrying that id and,
// for debuginfo, symbols. token is the caller's lease, if any: an upload
// while another client holds the lease is refused.
func (s *Store) Put(ctx context.Context, rawKey string, rawKind string, body io.Reader, declared int64, token string) (PutResult, error) {
	var res PutResult
	key, err := ParseKey(rawKey)
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
	if len(token) > maxTokenLen {
		// Tokens are the store's own (24 hex digits); a long one would be
		// written into a shared lease object.
		s.obs.Rejected(ReasonBadRequest)
		return res, reject(ReasonBadRequest, http.StatusBadRequest, fmt.Errorf("lease token of %d bytes, at most %d", len(token), maxTokenLen))
	}
	if s.has(key, kind) || s.statBackend(ctx, key, kind) {
		s.obs.Deduped(kind)
		s.release(key, token)
		return res, nil
	}
	if err := s.room(max(declared, 0)); err != nil {
		return res, err
	}
	select {
	case s.uploads <- struct{}{}:
		defer func() { <-s.uploads }()
	default:
		s.obs.Rejected(ReasonBusy)
		return res, reject(ReasonBusy, http.StatusServiceUnavailable, fmt.Errorf("%d uploads in progress; retry later", s.cfg.MaxUploads))
	}
	// Hold the lease for the upload itself, so a client without one that
	// races us is refused rather than writing twice.
	if token == "" {
		token = newToken()
	}
	held, err := s.hold(ctx, key, token)
	if err != nil {
		return res, err
	}
	if !held {
		s.obs.Rejected(ReasonLeaseHeld)
		return res, reject(ReasonLeaseHeld, http.StatusConflict, errors.New("another client is uploading this build id"))
	}
	defer s.release(key, token)

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
	n, err := io.Copy(tmp, &leaseKeeper{r: io.LimitReader(body, s.cfg.MaxUploadBytes+1), s: s, ctx: ctx, key: key, token: token, last: time.Now()})
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
	if rerr := verifyKey(tmp.Name(), key, kind); rerr != nil {
		s.obs.Rejected(rerr.Reason)
		return res, rerr
	}
	if err := tmp.Close(); err != nil {
		return res, err
	}
	// Another replica may have stored it while this body streamed in.
	if s.statBackend(ctx, key, kind) {
		s.obs.Deduped(kind)
		return res, nil
	}
	if err := s.reserve(n); err != nil {
		return res, err
	}
	err = s.be.Put(ctx, key, kind, tmp.Name(), n)
	s.mu.Lock()
	s.reserved -= n
	s.reservedObjects--
	s.mu.Unlock()
	if err != nil {
		return res, fmt.Errorf("storing %s/%s in %s: %w", key.Path(), kind, s.be, err)
	}
	s.mu.Lock()
	if s.index[key]&kindBit(kind) == 0 {
		s.objects++
		s.bytes += n
	}
	s.index[key] |= kindBit(kind)
	s.mu.Unlock()
	res.Stored = true
	s.gen.Add(1)
	s.obs.Stored(kind, n)
	s.log.Info("symbol store: stored", zap.String("key", key.Path()), zap.String("kind", string(kind)), zap.Int64("bytes", n))
	return res, nil
}

// room refuses an upload of n bytes that cannot fit, before its body is read.
func (s *Store) room(n int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fullLocked(n)
}

// reserve counts n bytes and one object against the limits while they are
// written, so concurrent uploads cannot pass them together.
func (s *Store) reserve(n int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.fullLocked(n); err != nil {
		return err
	}
	s.reserved += n
	s.reservedObjects++
	return nil
}

func (s *Store) fullLocked(n int64) error {
	var err error
	switch {
	case s.objects+s.reservedObjects >= s.cfg.MaxObjects:
		err = fmt.Errorf("the store holds %d objects, its limit (max_objects)", s.objects)
	case s.bytes+s.reserved+n > s.cfg.MaxStoredBytes:
		err = fmt.Errorf("%d bytes stored, %d more would pass max_stored_bytes %d", s.bytes, n, s.cfg.MaxStoredBytes)
	default:
		return nil
	}
	s.obs.Rejected(ReasonStoreFull)
	if !s.fullLogged {
		s.fullLogged = true
		s.log.Warn("symbol store: full, uploads are refused until space is freed or the limit raised", zap.Error(err))
	}
	return reject(ReasonStoreFull, http.StatusInsufficientStorage, err)
}

// hold takes or confirms the upload lease on key for token.
func (s *Store) hold(ctx context.Context, key Key, token string) (bool, error) {
	if s.shared != nil {
		ok, err := s.shared.AcquireLease(ctx, key, token, s.cfg.Lease)
		if err != nil {
			return false, fmt.Errorf("leasing %s in %s: %w", key, s.be, err)
		}
		return ok, nil
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if l, ok := s.leases[key]; ok && now.Before(l.until) && l.token != token {
		return false, nil
	}
	s.leases[key] = lease{token: token, until: now.Add(s.cfg.Lease)}
	return true, nil
}

// statBackend catches files another gateway stored in a shared backend
// since the last listing.
func (s *Store) statBackend(ctx context.Context, key Key, kind Kind) bool {
	ok, _ := s.probe(ctx, key, kind)
	return ok
}

// probe is statBackend that tells a file absent from a backend that could
// not answer.
func (s *Store) probe(ctx context.Context, key Key, kind Kind) (bool, error) {
	if _, local := s.be.(*Dir); local {
		return false, nil
	}
	size, err := s.be.Stat(ctx, key, kind)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	s.mu.Lock()
	if s.index[key]&kindBit(kind) == 0 {
		s.index[key] |= kindBit(kind)
		s.objects++
		s.bytes += size
		s.gen.Add(1)
	}
	s.mu.Unlock()
	return true, nil
}

// leaseKeeper extends an upload's lease as its body streams in.
type leaseKeeper struct {
	r     io.Reader
	s     *Store
	ctx   context.Context
	key   Key
	token string
	last  time.Time
}

func (k *leaseKeeper) Read(p []byte) (int, error) {
	n, err := k.r.Read(p)
	if now := time.Now(); n > 0 && now.Sub(k.last) > k.s.cfg.Lease/4 {
		k.last = now
		if k.s.shared != nil {
			// Lost (expired and taken over): the upload goes on; the store
			// checks for the file again before writing it.
			if _, lerr := k.s.shared.ExtendLease(k.ctx, k.key, k.token, k.s.cfg.Lease); lerr != nil {
				k.s.log.Debug("symbol store: extending a lease failed", zap.Stringer("key", k.key), zap.Error(lerr))
			}
			return n, err
		}
		k.s.mu.Lock()
		if l, ok := k.s.leases[k.key]; ok && l.token == k.token {
			k.s.leases[k.key] = lease{token: k.token, until: now.Add(k.s.cfg.Lease)}
		}
		k.s.mu.Unlock()
	}
	return n, err
}

// releaseTimeout bounds dropping a shared lease after an upload.
const releaseTimeout = 10 * time.Second

func (s *Store) release(key Key, token string) {
	if token == "" {
		return
	}
	if s.shared != nil {
		ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		defer cancel()
		if err := s.shared.ReleaseLease(ctx, key, token); err != nil {
			s.log.Debug("symbol store: releasing a lease failed; it expires", zap.Stringer("key", key), zap.Error(err))
		}
		return
	}
	s.mu.Lock()
	if l, ok := s.leases[key]; ok && l.token == token {
		delete(s.leases, key)
	}
	s.mu.Unlock()
}

// Verify checks an uploaded file: a well-formed ELF file that carries the
// id of key (a GNU build id in hex, or "gobuildid/HEX") and, for
// debuginfo, symbols.
func Verify(path, rawKey string, kind Kind) *RejectError {
	key, err := ParseKey(rawKey)
	if err != nil {
		return reject(ReasonInvalidBuildID, http.StatusBadRequest, err)
	}
	return verifyKey(path, key, kind)
}

func verifyKey(path string, key Key, kind Kind) *RejectError {
	f, err := elfx.Open(path)
	if err != nil {
		return reject(ReasonNotELF, http.StatusUnprocessableEntity, fmt.Errorf("not a well-formed ELF file: %v", err))
	}
	defer f.Close()
	switch key.NS {
	case NSGoBuildID:
		got, err := buildid.Go(f)
		if err != nil {
			return reject(ReasonMismatch, http.StatusUnprocessableEntity, fmt.Errorf("the file has no Go build id: %v", err))
		}
		if want := key.GoBuildID(); got != want {
			return reject(ReasonMismatch, http.StatusUnprocessableEntity, fmt.Errorf("the file's Go build id is %.300q, not %q", got, want))
		}
	default:
		got, err := buildid.GNU(f)
		if err != nil {
			return reject(ReasonMismatch, http.StatusUnprocessableEntity, fmt.Errorf("the file has no GNU build id: %v", err))
		}
		if buildid.HexString(got) != key.ID {
			return reject(ReasonMismatch, http.StatusUnprocessableEntity, fmt.Errorf("the file's build id is %x, not %s", got, key.ID))
		}
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
func (s *Store) Open(ctx context.Context, rawKey string, kind Kind) (Object, error) {
	key, err := ParseKey(rawKey)
	if err != nil {
		return nil, reject(ReasonInvalidBuildID, http.StatusBadRequest, err)
	}
	return s.be.Open(ctx, key, kind)
}

// Locate implements the symbolizer's locator: the stored files of a GNU
// build id as local paths (fetched into the scratch cache for a remote
// backend). Uploaded debuginfo is returned as the debug file; an uploaded
// executable as the binary.
func (s *Store) Locate(ctx context.Context, rawID string) (binPath, debugPath string, err error) {
	key, err := GNUKey(rawID)
	if err != nil {
		return "", "", err
	}
	return s.LocateKey(ctx, key)
}

// LocateKey is Locate for any key: a Go binary without a GNU build id is
// found by its Go build id.
func (s *Store) LocateKey(ctx context.Context, key Key) (binPath, debugPath string, err error) {
	if err := key.valid(); err != nil {
		return "", "", err
	}
	s.Refresh(ctx)
	if !s.has(key, DebugInfo) && !s.has(key, Executable) {
		ok, err := s.probe(ctx, key, DebugInfo)
		if err != nil {
			// Not remembered as absent: the next batch asks again.
			return "", "", fmt.Errorf("symbol store %s: %w: %v", s.be, frame.ErrFetchFailed, err)
		}
		if !ok {
			return "", "", fmt.Errorf("symbol store has no %s: %w", key, frame.ErrNotFound)
		}
	}
	if s.has(key, DebugInfo) {
		if debugPath, err = s.local(ctx, key, DebugInfo); err != nil {
			return "", "", err
		}
	}
	if s.has(key, Executable) {
		if binPath, err = s.local(ctx, key, Executable); err != nil && debugPath == "" {
			return "", "", err
		}
	}
	s.obs.Served(DebugInfo, 0)
	return binPath, debugPath, nil
}

// local returns a path on this host for a stored file. A remote file is
// copied into the scratch cache once, by one goroutine bounded by
// FetchTimeout rather than by the caller: a caller whose batch ends first
// stops waiting, and the next finds the copy done or still running.
func (s *Store) local(ctx context.Context, key Key, kind Kind) (string, error) {
	if p, ok := s.be.LocalPath(key, kind); ok {
		return p, nil
	}
	dst := filepath.Join(s.tmp, "cache", string(key.NS), key.ID, string(kind))
	if st, err := os.Stat(dst); err == nil && st.Mode().IsRegular() {
		return dst, nil
	}
	ch := s.fetches.DoChan(dst, func() (any, error) {
		fctx, cancel := context.WithTimeout(context.Background(), s.cfg.FetchTimeout)
		defer cancel()
		return dst, s.fetch(fctx, key, kind, dst)
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return "", r.Err
		}
		return dst, nil
	case <-ctx.Done():
		return "", fmt.Errorf("%s/%s: still copying from %s: %w", key.Path(), kind, s.be, frame.ErrTimeout)
	}
}

func (s *Store) fetch(ctx context.Context, key Key, kind Kind, dst string) error {
	o, err := s.be.Open(ctx, key, kind)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s/%s: %w", key.Path(), kind, frame.ErrNotFound)
		}
		return fmt.Errorf("%s/%s: %w: %v", key.Path(), kind, frame.ErrFetchFailed, err)
	}
	defer o.Close()
	if o.Size() > s.cfg.CacheBytes || o.Size() > s.cfg.MaxUploadBytes {
		return fmt.Errorf("%s/%s of %d bytes: %w", key.Path(), kind, o.Size(), frame.ErrLimitExceeded)
	}
	s.makeRoom(o.Size())
	if err := os.MkdirAll(filepath.Dir(dst), 0o750); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), "fetch-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	n, err := io.Copy(tmp, io.LimitReader(o, o.Size()+1))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil || n != o.Size() {
		return fmt.Errorf("%s/%s: %w: %d of %d bytes: %v", key.Path(), kind, frame.ErrFetchFailed, n, o.Size(), err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return err
	}
	s.cacheMu.Lock()
	s.cache[dst] = n
	s.cached += n
	s.cacheMu.Unlock()
	return nil
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
