package symstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"
)

type lease struct {
	token string
	until time.Time
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
	// Kind echoes MissingRequest.Kind "symindex", so a gateway can tell an
	// owner that knows index leases from an older one that would have
	// answered about upload leases instead.
	Kind Kind `json:"kind,omitempty"`
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

// parseQuery validates a query's ids and held leases with parse (ParseKey,
// or GNUKey for indexes): one bad id refuses the whole query.
func (s *Store) parseQuery(req MissingRequest, parse func(string) (Key, error)) ([]Key, map[Key]string, error) {
	if len(req.BuildIDs) > s.cfg.MaxQueryIDs || len(req.Held) > len(req.BuildIDs) {
		s.obs.Rejected(ReasonTooLarge)
		return nil, nil, reject(ReasonTooLarge, http.StatusRequestEntityTooLarge,
			fmt.Errorf("%d ids (%d held) in one query, at most %d", len(req.BuildIDs), len(req.Held), s.cfg.MaxQueryIDs))
	}
	keys := make([]Key, len(req.BuildIDs))
	for i, id := range req.BuildIDs {
		k, err := parse(id)
		if err != nil {
			s.obs.Rejected(ReasonInvalidBuildID)
			return nil, nil, reject(ReasonInvalidBuildID, http.StatusBadRequest, err)
		}
		keys[i] = k
	}
	held := map[Key]string{}
	for id, tok := range req.Held {
		k, err := parse(id)
		if err != nil || tok == "" || len(tok) > maxTokenLen {
			s.obs.Rejected(ReasonBadRequest)
			return nil, nil, reject(ReasonBadRequest, http.StatusBadRequest, fmt.Errorf("held lease %.80q: not an id and a token", id))
		}
		held[k] = tok
	}
	return keys, held, nil
}

// maxTokenLen bounds a lease token sent back in a query.
const maxTokenLen = 64

// Query is Missing for a whole request: ids in req.Held whose lease the
// caller still holds (or that nobody else took meanwhile) are leased to it
// again under the same token, for another lease duration. An agent renews
// its leases this way while it extracts a large file.
func (s *Store) Query(ctx context.Context, req MissingRequest) (MissingResult, error) {
	switch req.Kind {
	case "":
	case SymIndex:
		return s.queryIndex(ctx, req)
	default:
		s.obs.Rejected(ReasonInvalidKind)
		return MissingResult{}, reject(ReasonInvalidKind, http.StatusBadRequest, fmt.Errorf("query kind %.40q is not \"\" or symindex", req.Kind))
	}
	ids, withLease := req.BuildIDs, req.Lease
	keys, held, err := s.parseQuery(req, ParseKey)
	if err != nil {
		return MissingResult{}, err
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
			ok, err := s.shared.AcquireLease(ctx, uploadLease(k), tok, s.cfg.Lease)
			switch {
			case err != nil:
				answers[i].err = err
			case !ok:
				answers[i].pending = true
			case s.statBackend(ctx, k, DebugInfo):
				// The holder stored the file and released its lease between
				// the first look and ours: a store writes before it
				// releases, so looking again now cannot miss it.
				s.release(k, tok)
				answers[i].present = true
			default:
				answers[i].lease = Lease{BuildID: k.String(), Token: tok}
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

// hold takes or confirms the upload lease on key for token.
func (s *Store) hold(ctx context.Context, key Key, token string) (bool, error) {
	if s.shared != nil {
		ok, err := s.shared.AcquireLease(ctx, uploadLease(key), token, s.cfg.Lease)
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
			if _, lerr := k.s.shared.ExtendLease(k.ctx, uploadLease(k.key), k.token, k.s.cfg.Lease); lerr != nil {
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

func (s *Store) release(key Key, token string) { s.dropLease(uploadLease(key), token) }

// dropLease releases token's lease on name, in the backend or in memory.
func (s *Store) dropLease(name LeaseName, token string) {
	if token == "" {
		return
	}
	if r, ok := s.be.(*Remote); ok && name.For == SymIndex {
		s.mu.Lock()
		if l, ok := s.indexLeases[name.Key]; ok && l.token == token {
			delete(s.indexLeases, name.Key)
		}
		stored := s.index[name.Key]&kindBit(SymIndex) != 0
		s.mu.Unlock()
		if stored {
			return // the owner let it go when it stored the index
		}
		ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		defer cancel()
		if err := r.releaseIndex(ctx, name.Key, token); err != nil {
			s.log.Debug("symbol store: releasing an index lease failed; it expires", zap.Stringer("key", name.Key), zap.Error(err))
		}
		return
	}
	if s.shared != nil {
		ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		defer cancel()
		if err := s.shared.ReleaseLease(ctx, name, token); err != nil {
			s.log.Debug("symbol store: releasing a lease failed; it expires", zap.Stringer("key", name.Key),
				zap.String("for", string(name.For)), zap.Error(err))
		}
		return
	}
	m := s.leaseMap(name)
	s.mu.Lock()
	if l, ok := m[name.Key]; ok && l.token == token {
		delete(m, name.Key)
	}
	s.mu.Unlock()
}

// leaseMap is where name's lease lives when leases are in memory. The maps
// are made once in New, so reading the fields needs no lock.
func (s *Store) leaseMap(name LeaseName) map[Key]lease {
	if name.For == SymIndex {
		return s.indexLeases
	}
	return s.leases
}
