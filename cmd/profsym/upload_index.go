package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/profsym/profsym/internal/symbolize"
	"github.com/profsym/profsym/internal/symstore"
)

// indexItem is one uploaded (or already stored) debug file to index.
type indexItem struct{ file, id, extracted string }

// uploadIndexes compiles the symbol index of each extracted debug file
// and stores it through the store's index lease, so that gateways read it
// instead of parsing the debug file (docs/symbol-index.md). The index is
// compiled from the file the store holds, with the processor's default
// options, so it answers as a gateway would from that file. It returns how
// many failed; an object that cannot be indexed whole (no DWARF) is said
// and skipped.
func uploadIndexes(ctx context.Context, endpoint, token string, answer time.Duration, items []indexItem, scratch string, stdout, stderr io.Writer) int {
	hc := uploadHTTPClient(answer)
	hc.Transport = bearer{token, hc.Transport}
	be, err := symstore.NewRemote(endpoint, hc)
	if err != nil {
		say(stderr, "profsym upload: %v\n", err)
		return len(items)
	}
	st, err := symstore.New(ctx, symstore.Config{Backend: be, ScratchDir: scratch})
	if err != nil {
		say(stderr, "profsym upload: %v\n", err)
		return len(items)
	}
	r := symbolize.New(symbolize.DefaultOptions())
	defer func() { _ = r.Close() }()
	failed := 0
	for _, it := range items {
		if err := uploadIndex(ctx, st, r, it, scratch, stdout); err != nil {
			say(stderr, "%s: symbol index: %v\n", it.file, err)
			failed++
		}
	}
	return failed
}

func uploadIndex(ctx context.Context, st *symstore.Store, r *symbolize.Resolver, it indexItem, scratch string, stdout io.Writer) error {
	held, release, err := st.LeaseIndex(ctx, it.id)
	if err != nil {
		return err
	}
	defer release()
	if !held {
		say(stdout, "%s: index of %s already stored or being written\n", it.file, it.id)
		return nil
	}
	h, err := r.Open(ctx, "", it.extracted)
	if err != nil {
		return err
	}
	defer h.Close()
	f, err := os.CreateTemp(scratch, "index-*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(f.Name()) }()
	stats, err := h.WriteIndex(ctx, f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if errors.Is(err, symbolize.ErrNotIndexable) {
		say(stdout, "%s: %s not indexed: %v\n", it.file, it.id, err)
		return nil
	}
	if err != nil {
		return err
	}
	if err := st.PutIndex(ctx, it.id, f.Name()); err != nil {
		return err
	}
	say(stdout, "%s: index of %s stored (%d ranges, %d bytes)\n", it.file, it.id, stats.Ranges, stats.Bytes)
	return nil
}

// bearer adds the store's token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(req *http.Request) (*http.Response, error) {
	if b.token == "" {
		return b.next.RoundTrip(req)
	}
	req = req.Clone(req.Context())
	req.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(req)
}

// say writes one line of the run's report; a report that cannot be
// written changes nothing the run did.
func say(w io.Writer, format string, args ...any) { _, _ = fmt.Fprintf(w, format, args...) }
