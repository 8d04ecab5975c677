package symbolstoreextension

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componentstatus"
	"go.opentelemetry.io/collector/config/confighttp"
	"go.opentelemetry.io/collector/extension"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.uber.org/zap"

	"github.com/profsym/profsym/extension/symbolstoreextension/internal/metadata"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/internal/symstore"
)

// Store is the extension. The symbolization processor finds it among the
// host's extensions and calls Locate in process.
type Store struct {
	cfg *Config
	set extension.Settings
	tel *metadata.TelemetryBuilder

	store atomic.Pointer[symstore.Store] // set once started; read on the symbolizer's path

	mu     sync.Mutex
	server *http.Server
	stop   chan struct{}
	wg     sync.WaitGroup
}

var _ extension.Extension = (*Store)(nil)

func newStore(set extension.Settings, cfg *Config) (*Store, error) {
	tel, err := metadata.NewTelemetryBuilder(set.TelemetrySettings)
	if err != nil {
		return nil, err
	}
	return &Store{cfg: cfg, set: set, tel: tel}, nil
}

// Start opens the backend, lists it, and serves HTTP (unless it reads a
// remote store).
func (s *Store) Start(ctx context.Context, host component.Host) error {
	log := s.set.Logger
	var be symstore.Backend
	var err error
	switch b := s.cfg.Storage.S3; {
	case s.cfg.remote():
		var hc *http.Client
		hc, err = s.cfg.Storage.Remote.ClientConfig.ToClient(ctx, host.GetExtensions(), s.set.TelemetrySettings)
		if err != nil {
			return fmt.Errorf("storage.remote: %w", err)
		}
		be, err = symstore.NewRemote(s.cfg.Storage.Remote.ClientConfig.Endpoint, hc)
	case b.Bucket != "":
		var s3 *symstore.S3
		s3, err = symstore.NewS3(ctx, symstore.S3Config{
			Endpoint: b.Endpoint, Bucket: b.Bucket, Prefix: b.Prefix, Region: b.Region,
			AccessKeyID: b.AccessKeyID, SecretAccessKey: string(b.SecretAccessKey),
			Insecure: b.Insecure, CreateBucket: b.CreateBucket,
		})
		if err == nil {
			be = s3
			if ok, why := s3.Conditional(); ok {
				log.Info("symbol store: upload leases live in the bucket, shared by every gateway over it")
			} else {
				log.Warn("symbol store: the S3 server does not honour conditional writes, so upload leases stay in this gateway's memory: "+
					"with several gateways over the bucket, agents may upload one build id once per gateway (it is stored once)",
					zap.Error(why))
			}
		}
	default:
		be, err = symstore.NewDir(s.cfg.Storage.Directory)
	}
	if err != nil {
		return err
	}
	st, err := symstore.New(ctx, symstore.Config{
		Backend:        be,
		ScratchDir:     s.cfg.Storage.ScratchDirectory,
		MaxUploadBytes: s.cfg.MaxUploadSize,
		Lease:          s.cfg.LeaseDuration,
		MaxQueryIDs:    s.cfg.MaxQueryIDs,
		MaxUploads:     s.cfg.MaxConcurrentUploads,
		MaxStoredBytes: s.cfg.MaxStoredBytes,
		MaxObjects:     s.cfg.MaxObjects,
		MaxIndexBytes:  s.cfg.MaxIndexBytes,
		CacheBytes:     s.cfg.Storage.CacheMaxBytes,
		Rescan:         s.cfg.Storage.Rescan,
		Logger:         log,
		Observer:       storeObserver{s.tel},
	})
	if err != nil {
		return err
	}
	if err := s.tel.RegisterSymbolstoreFilesCallback(func(_ context.Context, o metric.Int64Observer) error {
		n, _ := st.Size()
		o.Observe(n)
		return nil
	}); err != nil {
		return err
	}
	if err := s.tel.RegisterSymbolstoreSizeCallback(func(_ context.Context, o metric.Int64Observer) error {
		_, b := st.Size()
		o.Observe(b)
		return nil
	}); err != nil {
		return err
	}

	if _, local := be.(*symstore.Dir); !local {
		s.watch(st)
	}
	if s.cfg.remote() {
		s.store.Store(st)
		log.Info("symbol store: reading a remote store; serving nothing here (agents upload to it, gateways share symbol indexes through it)", zap.Stringer("backend", be))
		return nil
	}

	sc := s.cfg.ServerConfig // ToServer fills defaults in its receiver
	if sc.MaxRequestBodySize <= 0 {
		// Gateways reading this store send their symbol indexes here too.
		sc.MaxRequestBodySize = max(s.cfg.MaxUploadSize, s.cfg.MaxIndexBytes) + 1<<20
	}
	handler := st.Handler()
	if !sc.Auth.HasValue() && !isLoopback(sc.NetAddr.Endpoint) {
		if s.cfg.AllowUnauthenticatedUploads {
			log.Warn("symbol store listens beyond loopback without authentication and allow_unauthenticated_uploads: "+
				"anyone who reaches it can upload and read symbols; set PROFSYM_SYMBOLS_TOKEN (config/symbols-auth-gateway.yaml) or configure auth",
				zap.String("endpoint", sc.NetAddr.Endpoint))
		} else {
			log.Warn("symbol store listens beyond loopback without authentication: it serves symbols to anyone who reaches it and refuses "+
				"uploads (401); set PROFSYM_SYMBOLS_TOKEN (config/symbols-auth-gateway.yaml) or configure auth",
				zap.String("endpoint", sc.NetAddr.Endpoint))
			handler = s.readOnly(handler)
		}
	}
	ln, err := sc.ToListener(ctx)
	if err != nil {
		return err
	}
	srv, err := sc.ToServer(ctx, host.GetExtensions(), s.set.TelemetrySettings, handler,
		confighttp.WithErrorHandler(func(w http.ResponseWriter, _ *http.Request, msg string, status int) {
			reason := symstore.ReasonBadRequest
			if status == http.StatusUnauthorized {
				reason = symstore.ReasonUnauthorized
			}
			s.tel.SymbolstoreUploadsRejected.Add(context.Background(), 1, metric.WithAttributes(attribute.String("reason", reason)))
			w.Header().Set("X-Profsym-Reason", reason)
			http.Error(w, msg, status)
		}))
	if err != nil {
		ln.Close()
		return err
	}
	s.store.Store(st)
	s.mu.Lock()
	s.server = srv
	s.mu.Unlock()
	log.Info("symbol store serving", zap.String("endpoint", ln.Addr().String()), zap.Stringer("backend", be),
		zap.Bool("auth", sc.Auth.HasValue()), zap.Bool("tls", sc.TLS.HasValue()))
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			componentstatus.ReportStatus(host, componentstatus.NewFatalErrorEvent(err))
		}
	}()
	return nil
}

// watch keeps a shared or remote backend's view fresh in the background:
// a bucket relisted, a remote store's status polled (so its new files
// reach frames that failed before), every half rescan.
func (s *Store) watch(st *symstore.Store) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stop = make(chan struct{})
	stop := s.stop
	every := max(s.cfg.Storage.Rescan/2, time.Second)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				st.Refresh(context.Background())
			}
		}
	}()
}

// Shutdown stops serving.
func (s *Store) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	srv, stop := s.server, s.stop
	s.stop = nil
	s.mu.Unlock()
	if stop != nil {
		close(stop)
	}
	var err error
	if srv != nil {
		err = srv.Shutdown(ctx)
	}
	s.wg.Wait()
	s.tel.Shutdown()
	return err
}

// Locate gives the symbolization processor the stored files of a build id
// as local paths (the symbolizer's locator interface).
func (s *Store) Locate(ctx context.Context, buildID string) (string, string, error) {
	st := s.store.Load()
	if st == nil {
		return "", "", errors.New("symbol store not started")
	}
	return st.Locate(ctx, buildID)
}

// The store keeps compiled symbol indexes for the symbolization processor.
var (
	_ locate.IndexStore = (*Store)(nil)
	_ locate.IndexStore = (*symstore.Store)(nil)
)

// errNotStarted answers index calls before Start: LocateIndex wraps
// frame.ErrNotFound with it, so a caller builds its own index meanwhile.
var errNotStarted = errors.New("symbol store not started")

// LocateIndex returns a local path holding the symbol index stored for a
// GNU build id, or an error wrapping frame.ErrNotFound. A store reading a
// remote one over HTTP copies the owner's index into its scratch cache.
func (s *Store) LocateIndex(ctx context.Context, buildID string) (string, error) {
	st := s.store.Load()
	if st == nil {
		return "", fmt.Errorf("%w: %w", errNotStarted, frame.ErrNotFound)
	}
	return st.LocateIndex(ctx, buildID)
}

// LeaseIndex asks to build a build id's index (locate.IndexStore). It fails
// before Start. Over a remote store the owner hands the lease out, so one
// gateway of all those reading it builds each index.
func (s *Store) LeaseIndex(ctx context.Context, buildID string) (bool, func(), error) {
	st := s.store.Load()
	if st == nil {
		return false, func() {}, errNotStarted
	}
	return st.LeaseIndex(ctx, buildID)
}

// PutIndex stores a built index (locate.IndexStore): over a remote store,
// in the owner, for every gateway reading it. It fails before Start.
func (s *Store) PutIndex(ctx context.Context, buildID, path string) error {
	st := s.store.Load()
	if st == nil {
		return errNotStarted
	}
	return st.PutIndex(ctx, buildID, path)
}

// SymbolSource gives the symbolization processor's locate chain a source
// over the store: a mapping's files by its GNU build id, or by its Go build
// id (Go binaries linked without a GNU one).
func (s *Store) SymbolSource() locate.Source { return source{s} }

type source struct{ s *Store }

func (source) Name() string           { return locate.SourceStore }
func (src source) Generation() uint64 { return src.s.Generation() }

func (src source) Find(ctx context.Context, q *locate.Query) ([]locate.Candidate, error) {
	st := src.s.store.Load()
	if st == nil {
		return nil, nil
	}
	var keys []symstore.Key
	if k, err := symstore.GNUKey(q.ID.GNU); q.ID.GNU != "" && err == nil {
		keys = append(keys, k)
	}
	if k, err := symstore.GoKey(q.ID.Go); q.ID.Go != "" && err == nil {
		keys = append(keys, k)
	}
	var lastErr error
	for _, k := range keys {
		bin, dbg, err := st.LocateKey(ctx, k)
		if err != nil {
			if !errors.Is(err, frame.ErrNotFound) {
				lastErr = err
			}
			continue
		}
		var out []locate.Candidate
		for _, p := range []string{bin, dbg} {
			if p != "" {
				out = append(out, locate.Candidate{Path: p})
			}
		}
		return out, nil
	}
	return nil, lastErr
}

// Generation changes whenever the store gains files; the symbolization
// processor then retries frames that failed for lack of them.
func (s *Store) Generation() uint64 {
	st := s.store.Load()
	if st == nil {
		return 0
	}
	return st.Generation()
}

// readOnly refuses every write (uploads, and missing queries, which hand
// out upload leases) of a store nobody authenticates to: 401, counted as
// unauthorized. Reads (the debuginfod protocol, status) are served.
func (s *Store) readOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			next.ServeHTTP(w, r)
			return
		}
		s.tel.SymbolstoreUploadsRejected.Add(context.Background(), 1, metric.WithAttributes(attribute.String("reason", symstore.ReasonUnauthorized)))
		w.Header().Set("X-Profsym-Reason", symstore.ReasonUnauthorized)
		http.Error(w, "this symbol store takes uploads only with authentication (auth: bearertokenauth, docs/symbol-upload.md), "+
			"or with allow_unauthenticated_uploads", http.StatusUnauthorized)
	})
}

// isLoopback reports whether host:port binds to loopback only.
func isLoopback(endpoint string) bool {
	host, _, err := net.SplitHostPort(endpoint)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// storeObserver turns store events into the extension's metrics.
type storeObserver struct{ tel *metadata.TelemetryBuilder }

func kindAttr(k symstore.Kind) metric.AddOption {
	return metric.WithAttributes(attribute.String("kind", string(k)))
}

func (o storeObserver) Rejected(reason string) {
	o.tel.SymbolstoreUploadsRejected.Add(context.Background(), 1, metric.WithAttributes(attribute.String("reason", reason)))
}

func (o storeObserver) Stored(k symstore.Kind, n int64) {
	o.tel.SymbolstoreUploadsStored.Add(context.Background(), 1, kindAttr(k))
	o.tel.SymbolstoreReceivedBytes.Add(context.Background(), n)
}

func (o storeObserver) Deduped(k symstore.Kind) {
	o.tel.SymbolstoreUploadsDeduped.Add(context.Background(), 1, kindAttr(k))
}

func (o storeObserver) Served(k symstore.Kind, n int64) {
	o.tel.SymbolstoreHits.Add(context.Background(), 1, kindAttr(k))
	if n > 0 {
		o.tel.SymbolstoreServedBytes.Add(context.Background(), n)
	}
}

func (o storeObserver) Queried(ids, _ int) {
	o.tel.SymbolstoreMissingQueries.Add(context.Background(), int64(ids))
}
