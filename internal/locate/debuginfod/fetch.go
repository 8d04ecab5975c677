package debuginfod

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"

	"github.com/profsym/profsym/internal/frame"
)

// errStalled is the cancel cause when a server misses a Timeout window.
var errStalled = errors.New("no response or progress within the timeout")

// errTooSlow is the cancel cause when a download passes MaxDownloadTime.
var errTooSlow = errors.New("download took longer than the time limit")

// drainLimit is how much of an error response is read so that the
// connection can be reused; more is not worth waiting for.
const drainLimit = 64 << 10

// attempt downloads from one server into the cache. It returns the body
// bytes received, whether the failure blames the server (refused, timed
// out, 5xx, cut short: worth skipping it for a while), and the error.
func (c *Client) attempt(ctx context.Context, base, k, id string, kind Kind) (n int64, serverFault bool, err error) {
	u := base + "/buildid/" + id + "/" + kind.String()
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// The overall cap: a server sending just enough to beat the watchdog
	// must not hold a download (and its slot) forever.
	overall := c.clk.AfterFunc(c.cfg.MaxDownloadTime, func() { cancel(errTooSlow) })
	defer overall.Stop()
	// One timer covers both the wait for headers and each window of the
	// body: it is pushed back whenever minProgress more bytes arrive.
	watchdog := c.clk.AfterFunc(c.cfg.Timeout, func() { cancel(errStalled) })
	defer watchdog.Stop()

	req, err := http.NewRequestWithContext(actx, http.MethodGet, u, nil)
	if err != nil {
		return 0, false, fmt.Errorf("%s: %w: %v", u, frame.ErrFetchFailed, err)
	}
	req.Header.Set("User-Agent", userAgent)
	// elfutils' client sends its DEBUGINFOD_MAXSIZE so that a server can
	// refuse a larger file before sending it.
	req.Header.Set("X-Debuginfod-Maxsize", strconv.FormatInt(c.limit, 10))
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, true, transportError(actx, u, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusOK:
	case resp.StatusCode == http.StatusNotAcceptable:
		// elfutils' server answers 406 when the file is larger than the
		// X-Debuginfod-Maxsize we sent.
		io.Copy(io.Discard, io.LimitReader(resp.Body, drainLimit))
		return 0, false, fmt.Errorf("%s: HTTP %s: the server says the file exceeds the %d-byte limit: %w", u, resp.Status, c.limit, frame.ErrLimitExceeded)
	case resp.StatusCode == http.StatusNotFound:
		io.Copy(io.Discard, io.LimitReader(resp.Body, drainLimit))
		return 0, false, fmt.Errorf("%s: %w", u, frame.ErrNotFound)
	default:
		io.Copy(io.Discard, io.LimitReader(resp.Body, drainLimit))
		fault := resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests
		return 0, fault, fmt.Errorf("%s: HTTP %s: %w", u, resp.Status, frame.ErrFetchFailed)
	}
	if resp.ContentLength > c.limit {
		return 0, false, c.tooLarge(u, resp.ContentLength)
	}
	// Servers send the file's size here too (elfutils' client checks it
	// against DEBUGINFOD_MAXSIZE when the body is chunked).
	if sz, err := strconv.ParseInt(resp.Header.Get("X-Debuginfod-Size"), 10, 64); err == nil && sz > c.limit {
		return 0, false, c.tooLarge(u, sz)
	}

	tmp, err := os.CreateTemp(c.dir, tmpPrefix+"*")
	if err != nil {
		return 0, false, fmt.Errorf("%s: cache: %w: %v", u, frame.ErrFetchFailed, err)
	}
	tmpName := tmp.Name()
	// Every byte written is reserved in the cache budget first, so the
	// files and the downloads in progress together never pass
	// MaxCacheBytes, whatever the servers send.
	var reserved int64
	defer func() {
		if tmp != nil {
			tmp.Close()
		}
		if tmpName != "" {
			os.Remove(tmpName)
		}
		c.unreserve(k, reserved)
	}()

	buf := make([]byte, 128<<10)
	var window int64
	for {
		m, rerr := resp.Body.Read(buf)
		if m > 0 {
			if n+int64(m) > c.limit {
				return n + int64(m), false, c.tooLarge(u, -1)
			}
			if err := c.reserve(k, int64(m)); err != nil {
				return n + int64(m), false, fmt.Errorf("%s: %w", u, err)
			}
			reserved += int64(m)
			if _, werr := tmp.Write(buf[:m]); werr != nil {
				return n, false, fmt.Errorf("%s: writing cache: %w: %v", u, frame.ErrFetchFailed, werr)
			}
			n += int64(m)
			if window += int64(m); window >= minProgress {
				watchdog.Reset(c.cfg.Timeout)
				window = 0
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			// net/http reports a body shorter than Content-Length as
			// io.ErrUnexpectedEOF, which lands in ErrFetchFailed here.
			return n, true, transportError(actx, u, rerr)
		}
	}
	if resp.ContentLength >= 0 && n != resp.ContentLength {
		return n, true, fmt.Errorf("%s: got %d of %d bytes: %w", u, n, resp.ContentLength, frame.ErrFetchFailed)
	}
	// The cache trusts a file once renamed into place, so it must be on
	// disk before the name is.
	if err := tmp.Sync(); err != nil {
		return n, false, fmt.Errorf("%s: cache: %w: %v", u, frame.ErrFetchFailed, err)
	}
	if err := tmp.Close(); err != nil {
		tmp = nil
		return n, false, fmt.Errorf("%s: cache: %w: %v", u, frame.ErrFetchFailed, err)
	}
	tmp = nil
	if err := verifyPath(tmpName, id); err != nil {
		return n, false, fmt.Errorf("%s: %w", u, err)
	}
	if err := c.commit(k, tmpName, c.path(id, kind), n, reserved); err != nil {
		return n, false, fmt.Errorf("%s: cache: %w: %v", u, frame.ErrFetchFailed, err)
	}
	tmpName, reserved = "", 0
	return n, false, nil
}

func (c *Client) tooLarge(u string, size int64) error {
	if size < 0 {
		return fmt.Errorf("%s: body exceeds the %d-byte limit: %w", u, c.limit, frame.ErrLimitExceeded)
	}
	return fmt.Errorf("%s: body of %d bytes exceeds the %d-byte limit: %w", u, size, c.limit, frame.ErrLimitExceeded)
}

// transportError classifies a request or body error: the overall cap is
// ErrLimitExceeded, our watchdog or any network timeout ErrTimeout,
// everything else ErrFetchFailed.
func transportError(actx context.Context, u string, err error) error {
	if errors.Is(context.Cause(actx), errTooSlow) {
		return fmt.Errorf("%s: %w: %v", u, frame.ErrLimitExceeded, errTooSlow)
	}
	if errors.Is(context.Cause(actx), errStalled) {
		return fmt.Errorf("%s: %w: %v", u, frame.ErrTimeout, errStalled)
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return fmt.Errorf("%s: %w: %v", u, frame.ErrTimeout, err)
	}
	return fmt.Errorf("%s: %w: %v", u, frame.ErrFetchFailed, err)
}
