package symstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"go.uber.org/zap"
)

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
	done, err := s.admit(declared)
	if err != nil {
		return res, err
	}
	defer done()
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
// admit lets a body of declared bytes in (or of unknown size, declared
// < 0): room in the store for it and a place among MaxUploads, which
// bounds the scratch disk bodies use while verified. done gives the place
// back.
func (s *Store) admit(declared int64) (done func(), err error) {
	if err := s.room(max(declared, 0)); err != nil {
		return nil, err
	}
	select {
	case s.uploads <- struct{}{}:
		return func() { <-s.uploads }, nil
	default:
		s.obs.Rejected(ReasonBusy)
		return nil, reject(ReasonBusy, http.StatusServiceUnavailable, fmt.Errorf("%d uploads in progress; retry later", s.cfg.MaxUploads))
	}
}

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
