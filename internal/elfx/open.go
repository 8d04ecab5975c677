package elfx

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/profsym/profsym/internal/frame"
)

// maxBlockedOpens bounds the opens in flight across the process. An open
// that hangs in the kernel (a hard NFS mount whose server is gone, a FUSE
// daemon that never answers) pins an OS thread until it returns, whatever
// the caller's deadline; this cap keeps such files from using up threads.
const maxBlockedOpens = 64

var openSlots = make(chan struct{}, maxBlockedOpens)

// opens counts the files opened (mapped and parsed), for tests and
// benchmarks of the cold path.
var opens atomic.Int64

// Opens is how many files OpenContext has opened in this process.
func Opens() int64 { return opens.Load() }

// Open opens path with the default limits and DefaultOpenTimeout.
func Open(path string) (*File, error) {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultOpenTimeout)
	defer cancel()
	return OpenContext(ctx, path, Limits{})
}

// OpenContext maps path and parses its ELF headers, within lim and ctx.
//
// Only regular files are opened: a FIFO, socket or device fails with an
// error wrapping frame.ErrInvalidPath, and a FIFO never blocks the open
// (O_NONBLOCK). A file larger than lim.MaxFileBytes fails with
// frame.ErrLimitExceeded before any byte is read. Malformed ELF wraps
// frame.ErrCorruptFile; a missing file wraps fs.ErrNotExist.
//
// The open, the mapping and the header parse run on their own goroutine, so
// a file system that hangs (NFS, FUSE) costs the caller no more than ctx:
// OpenContext then returns an error wrapping frame.ErrTimeout, and the
// abandoned open closes whatever it gets when the kernel lets it go, so no
// descriptor or mapping leaks.
func OpenContext(ctx context.Context, path string, lim Limits) (*File, error) {
	lim = lim.withDefaults()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%s: not opened: %w: %w", path, frame.ErrTimeout, err)
	}
	select {
	case openSlots <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("%s: not opened, %d earlier opens still blocked: %w: %w",
			path, maxBlockedOpens, frame.ErrTimeout, ctx.Err())
	}
	type result struct {
		f   *File
		err error
	}
	res := make(chan result, 1)
	var mu sync.Mutex
	abandoned := false
	go func() {
		defer func() { <-openSlots }()
		f, err := open(path, lim)
		mu.Lock()
		defer mu.Unlock()
		if abandoned {
			if f != nil {
				f.Close()
			}
			return
		}
		res <- result{f, err}
	}()
	select {
	case r := <-res:
		return r.f, r.err
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		select {
		case r := <-res:
			return r.f, r.err
		default:
		}
		abandoned = true
		return nil, fmt.Errorf("%s: open did not finish in time: %w: %w", path, frame.ErrTimeout, ctx.Err())
	}
}

// open does the blocking work of OpenContext.
func open(path string, lim Limits) (*File, error) {
	data, unmap, err := mapFile(path, lim.MaxFileBytes)
	if err != nil {
		return nil, err
	}
	opens.Add(1)
	f, err := newFile(data, path, &budget{limit: lim.MaxDecompressedBytes, pool: lim.Pool})
	if err != nil {
		unmap(data)
		return nil, err
	}
	f.unmap = unmap
	f.drop = dropPages
	return f, nil
}

func notRegular(path string, mode string) error {
	return fmt.Errorf("%s is a %s, not a regular file: %w", path, mode, frame.ErrInvalidPath)
}

func tooLarge(path string, size, limit int64) error {
	return fmt.Errorf("%s: %d bytes, more than the %d-byte file limit: %w", path, size, limit, frame.ErrLimitExceeded)
}

func empty(path string) error {
	return fmt.Errorf("%s: empty file: %w", path, ErrCorrupt)
}
