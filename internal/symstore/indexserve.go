package symstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/profsym/profsym/internal/frame"
)

// The owner's side of shared indexes: gateways whose store reads this one
// over HTTP (Remote) fetch, lease and store symbol indexes here, so that
// in the Helm chart's default mode each binary is parsed by one gateway
// rather than by every replica.

// indexMagic opens every symbol index (internal/symbolize/symindex). The
// store does not parse indexes (it stays below the symbolizer); it checks
// only this, so a body that is not an index at all is refused, and leaves
// checksums and the build id inside to the readers.
const indexMagic = "PSYMIDX\x00"

// serveIndex answers PathIndex/ID.
func (s *Store) serveIndex(w http.ResponseWriter, r *http.Request, seg string) {
	id, err := parseID(seg)
	var key Key
	if err == nil {
		key, err = GNUKey(id)
	}
	if err != nil {
		s.obs.Rejected(ReasonInvalidBuildID)
		s.fail(w, reject(ReasonInvalidBuildID, http.StatusBadRequest, err))
		return
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		s.serveObject(w, r, key, SymIndex)
	case http.MethodPut, http.MethodPost:
		body := http.MaxBytesReader(w, r.Body, s.cfg.MaxIndexBytes)
		stored, err := s.receiveIndex(r.Context(), key, body, r.ContentLength, r.Header.Get(HeaderLease))
		if err != nil {
			s.fail(w, err)
			return
		}
		if stored {
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, "stored\n")
			return
		}
		_, _ = io.WriteString(w, "already stored\n")
	case http.MethodDelete:
		// A builder that gave up lets the next one start now rather than
		// when the lease expires; only the holder's token drops it.
		if tok := r.Header.Get(HeaderLease); tok != "" && len(tok) <= maxTokenLen {
			s.dropLease(LeaseName{Key: key, For: SymIndex}, tok)
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		w.Header().Set("Allow", "GET, HEAD, PUT, POST, DELETE")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	}
}

// receiveIndex stores an index sent over HTTP. token must hold key's index
// lease, or take it when nobody holds it (a builder whose lease lapsed
// while nobody else started still stores, as PutIndex does in process);
// while another token holds it the body is refused (409), as an upload
// is. The lease ends once the index is stored. It reports whether the
// index was stored (false: one already was).
func (s *Store) receiveIndex(ctx context.Context, key Key, body io.Reader, declared int64, token string) (bool, error) {
	if declared > s.cfg.MaxIndexBytes {
		s.obs.Rejected(ReasonTooLarge)
		return false, reject(ReasonTooLarge, http.StatusRequestEntityTooLarge,
			fmt.Errorf("%d bytes declared, at most %d (max_index_bytes)", declared, s.cfg.MaxIndexBytes))
	}
	switch {
	case len(token) > maxTokenLen:
		s.obs.Rejected(ReasonBadRequest)
		return false, reject(ReasonBadRequest, http.StatusBadRequest, fmt.Errorf("lease token of %d bytes, at most %d", len(token), maxTokenLen))
	case token == "":
		s.obs.Rejected(ReasonLeaseHeld)
		return false, reject(ReasonLeaseHeld, http.StatusConflict, fmt.Errorf("an index is stored under its index lease (%s)", HeaderLease))
	}
	name := LeaseName{Key: key, For: SymIndex}
	if s.has(key, SymIndex) || s.statBackend(ctx, key, SymIndex) {
		s.obs.Deduped(SymIndex)
		s.dropLease(name, token)
		return false, nil
	}
	// Index bodies use the scratch disk as uploads do: one bound for both.
	done, err := s.admit(declared)
	if err != nil {
		return false, err
	}
	defer done()
	ok, err := s.takeIndex(ctx, key, token)
	if err != nil {
		return false, fmt.Errorf("leasing the index of %s in %s: %w", key, s.be, err)
	}
	if !ok {
		s.obs.Rejected(ReasonLeaseHeld)
		return false, reject(ReasonLeaseHeld, http.StatusConflict, errors.New("another gateway holds the lease on this index"))
	}
	// Kept when the body is refused: its builder may send it again, and
	// lets the lease go itself (DELETE) when it gives up.

	tmp, err := os.CreateTemp(s.tmp, "index-recv-*")
	if err != nil {
		return false, err
	}
	defer func() {
		_ = tmp.Close()
		_ = os.Remove(tmp.Name()) // a no-op once stored
	}()
	n, err := io.Copy(tmp, io.LimitReader(body, s.cfg.MaxIndexBytes+1))
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe) || n > s.cfg.MaxIndexBytes:
		s.obs.Rejected(ReasonTooLarge)
		return false, reject(ReasonTooLarge, http.StatusRequestEntityTooLarge, fmt.Errorf("body over %d bytes (max_index_bytes)", s.cfg.MaxIndexBytes))
	case err != nil:
		s.obs.Rejected(ReasonTruncated)
		return false, reject(ReasonTruncated, http.StatusBadRequest, fmt.Errorf("reading body: %w", err))
	case declared >= 0 && n != declared:
		s.obs.Rejected(ReasonTruncated)
		return false, reject(ReasonTruncated, http.StatusBadRequest, fmt.Errorf("got %d of %d bytes", n, declared))
	}
	var magic [len(indexMagic)]byte
	if _, err := tmp.ReadAt(magic[:], 0); err != nil || !bytes.Equal(magic[:], []byte(indexMagic)) {
		s.obs.Rejected(ReasonBadRequest)
		return false, reject(ReasonBadRequest, http.StatusBadRequest, errors.New("the body is not a symbol index"))
	}
	if err := tmp.Sync(); err != nil {
		return false, err
	}
	if err := tmp.Close(); err != nil {
		return false, err
	}
	stored, err := s.putIndexLocal(ctx, key, tmp.Name())
	if errors.Is(err, frame.ErrLimitExceeded) {
		s.obs.Rejected(ReasonTooLarge)
		return false, reject(ReasonTooLarge, http.StatusRequestEntityTooLarge, err)
	}
	if err == nil {
		s.dropLease(name, token)
	}
	return stored, err
}

// queryIndex is Query for Kind SymIndex: which of the ids have no stored
// index and, with req.Lease, index leases on them (renewing those in
// req.Held). A gateway over Remote asks one id at a time.
func (s *Store) queryIndex(ctx context.Context, req MissingRequest) (MissingResult, error) {
	keys, held, err := s.parseQuery(req, GNUKey)
	if err != nil {
		return MissingResult{}, err
	}
	res := MissingResult{LeaseSeconds: int(s.cfg.Lease / time.Second), Kind: SymIndex}
	seen := make(map[Key]bool, len(keys))
	for _, k := range keys {
		if err := ctx.Err(); err != nil {
			return MissingResult{}, err
		}
		if s.has(k, SymIndex) || s.statBackend(ctx, k, SymIndex) {
			continue
		}
		switch {
		case !req.Lease:
			res.Upload = append(res.Upload, Lease{BuildID: k.String()})
			continue
		case seen[k]:
			res.Pending = append(res.Pending, k.String())
			continue
		}
		seen[k] = true
		tok, renew := held[k]
		if !renew {
			tok = newToken()
		}
		ok, err := s.takeIndex(ctx, k, tok)
		switch {
		case err != nil:
			return MissingResult{}, fmt.Errorf("leasing the index of %s in %s: %w", k, s.be, err)
		case !ok:
			res.Pending = append(res.Pending, k.String())
		case s.statBackend(ctx, k, SymIndex):
			// Stored by another replica, which let the lease go, between
			// the first look and ours.
			s.dropLease(LeaseName{Key: k, For: SymIndex}, tok)
		default:
			res.Upload = append(res.Upload, Lease{BuildID: k.String(), Token: tok})
		}
	}
	return res, nil
}

// takeIndex gives key's index lease to token unless another token holds
// one that has not expired; the holder taking it again extends it.
func (s *Store) takeIndex(ctx context.Context, key Key, token string) (bool, error) {
	if s.shared != nil {
		return s.shared.AcquireLease(ctx, LeaseName{Key: key, For: SymIndex}, token, s.cfg.Lease)
	}
	return s.holdIndex(key, token), nil
}
