package symstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/profsym/profsym/internal/clock"
)

// Client talks to a store over HTTP: the batch query and uploads. The agent
// and `profsym upload` share it.
type Client struct {
	base  string
	http  *http.Client
	token string
	// Limiter, when set, paces upload bodies (shared by every upload of the
	// client, so it bounds the client's total rate).
	Limiter *Limiter
}

// NewClient checks the endpoint (http or https URL) and reads the bearer
// token, if any.
func NewClient(endpoint, token string, hc *http.Client) (*Client, error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("symbol store endpoint %q is not an http(s) URL", endpoint)
	}
	if hc == nil {
		hc = &http.Client{Timeout: 0}
	}
	return &Client{base: strings.TrimRight(endpoint, "/"), http: hc, token: strings.TrimSpace(token)}, nil
}

// ReadToken reads a token file (the Helm chart mounts a Secret), trimming
// white space.
func ReadToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	if len(b) > 4096 {
		return "", fmt.Errorf("token file %s is %d bytes; a token is short", path, len(b))
	}
	return strings.TrimSpace(string(b)), nil
}

// Endpoint is the store's URL.
func (c *Client) Endpoint() string { return c.base }

// StatusError is a non-2xx answer.
type StatusError struct {
	Status int
	Reason string // X-Profsym-Reason, when the store gave one
	Msg    string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("symbol store answered %d %s: %s", e.Status, e.Reason, e.Msg)
}

// Permanent reports whether retrying the same request cannot help: a
// refusal of the request itself. Authentication failures are not: a token
// fixed on either side should let uploads resume without a restart.
func (e *StatusError) Permanent() bool {
	switch e.Status {
	case http.StatusConflict, http.StatusTooManyRequests, http.StatusRequestTimeout,
		http.StatusUnauthorized, http.StatusForbidden:
		return false
	}
	return e.Status >= 400 && e.Status < 500
}

// IsPermanent reports whether err is a refusal that a retry would repeat.
func IsPermanent(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Permanent()
}

func (c *Client) do(req *http.Request) (*http.Response, error) {
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	req.Header.Set("User-Agent", "profsym-symbols/1")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		return nil, &StatusError{Status: resp.StatusCode, Reason: resp.Header.Get("X-Profsym-Reason"), Msg: strings.TrimSpace(string(msg))}
	}
	return resp, nil
}

// Missing asks which ids (keys: GNU build ids in hex, or "gobuildid/HEX")
// the store lacks, leasing them to this client.
func (c *Client) Missing(ctx context.Context, ids []string) (MissingResult, error) {
	return c.query(ctx, MissingRequest{BuildIDs: ids, Lease: true})
}

// Renew asks again about one id whose lease this client holds: held is
// true while the lease is still its own (renewed for LeaseSeconds), present
// when the store has the id meanwhile; neither means someone else holds
// the lease now.
func (c *Client) Renew(ctx context.Context, id, token string) (held, present bool, err error) {
	res, err := c.query(ctx, MissingRequest{BuildIDs: []string{id}, Lease: true, Held: map[string]string{id: token}})
	if err != nil {
		return false, false, err
	}
	for _, l := range res.Upload {
		if l.Token == token {
			return true, false, nil
		}
	}
	return false, len(res.Upload) == 0 && len(res.Pending) == 0, nil
}

func (c *Client) query(ctx context.Context, q MissingRequest) (MissingResult, error) {
	body, _ := json.Marshal(q)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+PathMissing, bytes.NewReader(body))
	if err != nil {
		return MissingResult{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.do(req)
	if err != nil {
		return MissingResult{}, err
	}
	defer resp.Body.Close()
	var res MissingResult
	if err := json.NewDecoder(io.LimitReader(resp.Body, 8<<20)).Decode(&res); err != nil {
		return MissingResult{}, fmt.Errorf("symbol store: decoding missing answer: %w", err)
	}
	return res, nil
}

// Upload sends the file at path as kind for a key (a GNU build id in hex,
// or "gobuildid/HEX"). It returns whether the store stored it (false: it
// already had it).
func (c *Client) Upload(ctx context.Context, rawKey string, kind Kind, path, lease string) (stored bool, err error) {
	key, err := ParseKey(rawKey)
	if err != nil {
		return false, err
	}
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return false, err
	}
	var body io.Reader = f
	if c.Limiter != nil {
		body = c.Limiter.Reader(ctx, f)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, c.base+"/"+key.Path()+"/"+string(kind), body)
	if err != nil {
		return false, err
	}
	req.ContentLength = st.Size()
	req.Header.Set("Content-Type", "application/x-elf")
	if lease != "" {
		req.Header.Set(HeaderLease, lease)
	}
	resp, err := c.do(req)
	if err != nil {
		return false, err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	return resp.StatusCode == http.StatusCreated, nil
}

// Limiter is a token bucket over bytes, shared by readers.
type Limiter struct {
	rate  float64 // bytes per second; <= 0: unlimited
	burst float64
	clk   clock.Clock

	mu     sync.Mutex
	tokens float64
	last   time.Time
}

// NewLimiter paces to bytesPerSec with bursts of up to burst bytes.
func NewLimiter(bytesPerSec, burst int64) *Limiter {
	if burst <= 0 {
		burst = max(bytesPerSec/10, 32<<10)
	}
	return &Limiter{rate: float64(bytesPerSec), burst: float64(burst), clk: clock.Real, tokens: float64(burst), last: time.Now()}
}

// WithClock makes l pace on clk (tests: a clock.Virtual, whose time is
// then the pacing exactly); call it before l is used.
func (l *Limiter) WithClock(clk clock.Clock) *Limiter {
	l.clk, l.last = clk, clk.Now()
	return l
}

// Wait blocks until n bytes may pass (at once for a nil or unlimited
// limiter).
func (l *Limiter) Wait(ctx context.Context, n int) error {
	if l == nil || l.rate <= 0 {
		return nil
	}
	l.mu.Lock()
	now := l.clk.Now()
	l.tokens = min(l.burst, l.tokens+now.Sub(l.last).Seconds()*l.rate)
	l.last = now
	l.tokens -= float64(n)
	deficit := -l.tokens
	l.mu.Unlock()
	if deficit <= 0 {
		return nil
	}
	t := l.clk.NewTimer(time.Duration(deficit / l.rate * float64(time.Second)))
	defer t.Stop()
	select {
	case <-t.C():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Reader paces r through the limiter.
func (l *Limiter) Reader(ctx context.Context, r io.Reader) io.Reader {
	return &limitedReader{ctx: ctx, r: r, l: l}
}

type limitedReader struct {
	ctx context.Context
	r   io.Reader
	l   *Limiter
}

func (lr *limitedReader) Read(p []byte) (int, error) {
	if chunk := int(max(lr.l.burst, 4096)); len(p) > chunk {
		p = p[:chunk]
	}
	n, err := lr.r.Read(p)
	if n > 0 {
		if werr := lr.l.Wait(lr.ctx, n); werr != nil {
			return n, werr
		}
	}
	return n, err
}
