package symstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Remote reads another profsym store over HTTP: the debuginfod routes for
// files (/buildid/ and /gobuildid/), PathIndex for symbol indexes, and its
// status for changes. A gateway runs its store over Remote when one
// process owns the files (the Helm chart's symbols StatefulSet): it
// symbolizes from them in process, through a bounded local copy, and knows
// within one rescan when the owner gained files. Debug files are read-only
// here (agents upload to the owner); symbol indexes are leased from and
// stored to the owner (Store.LeaseIndex, Store.PutIndex), so the gateways
// reading one owner build each index once.
type Remote struct {
	base string
	http *http.Client

	mu   sync.Mutex
	last Status
	seen bool
}

// remoteTimeout bounds a HEAD or a status request; whole files are bounded
// by the store's FetchTimeout.
const remoteTimeout = 10 * time.Second

// NewRemote checks the URL of the owner store; hc carries its TLS and
// authentication (the collector's confighttp client).
func NewRemote(endpoint string, hc *http.Client) (*Remote, error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("remote symbol store %q is not an http(s) URL", endpoint)
	}
	if hc == nil {
		hc = &http.Client{}
	}
	return &Remote{base: strings.TrimRight(endpoint, "/"), http: hc}, nil
}

func (r *Remote) String() string { return "remote " + r.base }

func (r *Remote) url(key Key, kind Kind) (string, error) {
	if err := key.valid(); err != nil {
		return "", err
	}
	if kind == SymIndex {
		if key.NS != NSBuildID {
			// Indexes are kept by GNU build id only.
			return "", fmt.Errorf("no index of %s: %w", key, fs.ErrNotExist)
		}
		return r.base + PathIndex + "/" + key.ID, nil
	}
	if _, ok := ParseKind(string(kind)); !ok {
		return "", fmt.Errorf("kind %q: %w", kind, ErrReadOnly)
	}
	return r.base + "/" + key.Path() + "/" + string(kind), nil
}

// ErrReadOnly is the answer of a remote store to writes.
var ErrReadOnly = errors.New("the store is read-only here (remote): upload to its owner")

// List lists nothing: the owner's files are found one by one (Stat) as
// frames ask for them.
func (r *Remote) List(context.Context, func(Key, Kind, int64)) error { return nil }

func (r *Remote) do(ctx context.Context, method, u string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return nil, err
	}
	return r.send(req)
}

// send makes a request through the configured client (which adds the
// owner's authentication) and turns non-2xx answers into errors.
func (r *Remote) send(req *http.Request) (*http.Response, error) {
	req.Header.Set("User-Agent", "profsym-symbols/1")
	resp, err := r.http.Do(req)
	if err != nil {
		return nil, err
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		resp.Body.Close()
		return nil, fmt.Errorf("%s %s: %w", req.Method, req.URL, fs.ErrNotExist)
	case resp.StatusCode/100 != 2:
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		return nil, &StatusError{Status: resp.StatusCode, Reason: resp.Header.Get("X-Profsym-Reason"), Msg: strings.TrimSpace(string(msg))}
	}
	return resp, nil
}

func (r *Remote) Stat(ctx context.Context, key Key, kind Kind) (int64, error) {
	u, err := r.url(key, kind)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, remoteTimeout)
	defer cancel()
	resp, err := r.do(ctx, http.MethodHead, u)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.ContentLength, nil
}

func (r *Remote) Put(context.Context, Key, Kind, string, int64) error { return ErrReadOnly }

// Open streams a file. Its length is the response's Content-Length, which
// the copy into the cache checks the body against.
func (r *Remote) Open(ctx context.Context, key Key, kind Kind) (Object, error) {
	u, err := r.url(key, kind)
	if err != nil {
		return nil, err
	}
	resp, err := r.do(ctx, http.MethodGet, u)
	if err != nil {
		return nil, err
	}
	if resp.ContentLength < 0 {
		resp.Body.Close()
		return nil, fmt.Errorf("GET %s: no Content-Length", u)
	}
	mod, _ := http.ParseTime(resp.Header.Get("Last-Modified"))
	return &remoteObject{ReadCloser: resp.Body, size: resp.ContentLength, mod: mod}, nil
}

func (r *Remote) LocalPath(Key, Kind) (string, bool) { return "", false }

// Changed asks the owner for its status and reports whether it moved since
// the last answer (the first answer counts as a change).
func (r *Remote) Changed(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, remoteTimeout)
	defer cancel()
	resp, err := r.do(ctx, http.MethodGet, r.base+PathStatus)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	var st Status
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4096)).Decode(&st); err != nil {
		return false, fmt.Errorf("status of %s: %w", r.base, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	changed := !r.seen || st != r.last
	r.last, r.seen = st, true
	return changed, nil
}

// remoteObject is a response body. Only sequential reads are supported: a
// remote store is copied into the local cache, never served from here.
type remoteObject struct {
	io.ReadCloser
	size int64
	mod  time.Time
}

func (o *remoteObject) Size() int64        { return o.size }
func (o *remoteObject) ModTime() time.Time { return o.mod }
func (o *remoteObject) Seek(off int64, whence int) (int64, error) {
	return 0, errors.New("remote object: seek " + strconv.FormatInt(off, 10) + " unsupported")
}

// indexAnswer is the owner's answer about one index lease.
type indexAnswer struct {
	token   string // the lease is the caller's, under this token
	seconds int    // how long the owner's leases last
	stored  bool   // the owner has the index
}

// indexLease asks the owner for key's index lease, or to renew the one held
// under token.
func (r *Remote) indexLease(ctx context.Context, key Key, token string) (indexAnswer, error) {
	q := MissingRequest{BuildIDs: []string{key.ID}, Lease: true, Kind: SymIndex}
	if token != "" {
		q.Held = map[string]string{key.ID: token}
	}
	body, err := json.Marshal(q)
	if err != nil {
		return indexAnswer{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.base+PathMissing, bytes.NewReader(body))
	if err != nil {
		return indexAnswer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.send(req)
	if err != nil {
		return indexAnswer{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	var res MissingResult
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&res); err != nil {
		return indexAnswer{}, fmt.Errorf("index lease from %s: %w", r.base, err)
	}
	if res.Kind != SymIndex {
		// An owner from before index sharing answered about upload leases.
		return indexAnswer{}, fmt.Errorf("%s does not share symbol indexes (an older version): %w", r.base, ErrReadOnly)
	}
	ans := indexAnswer{seconds: res.LeaseSeconds, stored: true}
	for _, l := range res.Upload {
		if l.BuildID == key.ID {
			ans.stored = false
			if l.Token != "" && (token == "" || l.Token == token) {
				ans.token = l.Token
			}
		}
	}
	for _, id := range res.Pending {
		if id == key.ID {
			ans.stored = false
		}
	}
	return ans, nil
}

// indexPutTries bounds the attempts of one index upload the owner turns
// away as busy: an index costs a build, worth a short wait.
const indexPutTries = 3

// putIndex sends size bytes of f as key's index under the lease token. It
// reports whether the owner stored it (false: it had one).
func (r *Remote) putIndex(ctx context.Context, key Key, f io.ReaderAt, size int64, token string) (bool, error) {
	u, err := r.url(key, SymIndex)
	if err != nil {
		return false, err
	}
	for try := 1; ; try++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, io.NewSectionReader(f, 0, size))
		if err != nil {
			return false, err
		}
		req.ContentLength = size
		req.Header.Set("Content-Type", "application/octet-stream")
		req.Header.Set(HeaderLease, token)
		resp, err := r.send(req)
		var se *StatusError
		if errors.As(err, &se) && se.Status == http.StatusServiceUnavailable && try < indexPutTries {
			t := time.NewTimer(time.Duration(try) * 2 * time.Second)
			select {
			case <-t.C:
				continue
			case <-ctx.Done():
				t.Stop()
				return false, err
			}
		}
		if err != nil {
			return false, err
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusCreated, nil
	}
}

// releaseIndex gives token's index lease on key back to the owner.
func (r *Remote) releaseIndex(ctx context.Context, key Key, token string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, r.base+PathIndex+"/"+key.ID, nil)
	if err != nil {
		return err
	}
	req.Header.Set(HeaderLease, token)
	resp, err := r.send(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	return nil
}
