package symstore

import (
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
// files (/buildid/ and /gobuildid/) and its status for changes. A gateway
// runs its store over Remote when one process owns the files (the Helm
// chart's symbols StatefulSet): it symbolizes from them in process, through
// a bounded local copy, and knows within one rescan when the owner gained
// files. It is read-only; agents upload to the owner.
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
	req.Header.Set("User-Agent", "profsym-symbols/1")
	resp, err := r.http.Do(req)
	if err != nil {
		return nil, err
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		resp.Body.Close()
		return nil, fmt.Errorf("%s %s: %w", method, u, fs.ErrNotExist)
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
