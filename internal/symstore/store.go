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
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/singleflight"
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
	// DefaultMaxIndexBytes bounds one symbol index (PutIndex, LocateIndex).
	DefaultMaxIndexBytes = 1 << 30
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
	// MaxIndexBytes bounds one symbol index file: a larger one is neither
	// stored nor fetched (frame.ErrLimitExceeded), so a bad build or a
	// foreign object cannot fill the disk or the scratch cache.
	MaxIndexBytes int64
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
	// AcquireLease gives name's lease to token for ttl, unless another
	// token holds one that has not expired. It reports whether token holds
	// it now (a holder acquiring again extends it).
	AcquireLease(ctx context.Context, name LeaseName, token string, ttl time.Duration) (bool, error)
	// ExtendLease moves token's lease on name to ttl from now; false when
	// token no longer holds it.
	ExtendLease(ctx context.Context, name LeaseName, token string, ttl time.Duration) (bool, error)
	// ReleaseLease drops token's lease on name, if token still holds it.
	ReleaseLease(ctx context.Context, name LeaseName, token string) error
}

// LeaseName names a lease: the upload of Key's files (For "") or the build
// of Key's symbol index (For SymIndex). They are distinct leases, so an
// agent uploading an id and a gateway indexing it never wait on each other.
type LeaseName struct {
	Key Key
	For Kind
}

// uploadLease names the upload lease on key.
func uploadLease(key Key) LeaseName { return LeaseName{Key: key} }

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
	// indexLeases: index builds, apart from the upload leases above so
	// neither blocks the other (and agents' leases keep their bound).
	indexLeases map[Key]lease
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

func kindBit(k Kind) uint8 {
	switch k {
	case Executable:
		return 2
	case SymIndex:
		return 4
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
	if cfg.MaxIndexBytes <= 0 {
		cfg.MaxIndexBytes = DefaultMaxIndexBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	s := &Store{cfg: cfg, be: cfg.Backend, log: cfg.Logger, obs: cfg.Observer,
		index: map[Key]uint8{}, leases: map[Key]lease{}, indexLeases: map[Key]lease{}, cache: map[string]int64{},
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

// Generation changes whenever the store gains files, so a symbolizer can
// retry frames that failed before an upload.
func (s *Store) Generation() uint64 { return s.gen.Load() }

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
