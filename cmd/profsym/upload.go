package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/buildid"
	"github.com/profsym/profsym/internal/elfx/keepdebug"
	"github.com/profsym/profsym/internal/host/symupload"
	"github.com/profsym/profsym/internal/symstore"
)

// runUpload pushes the symbols of binaries (or their debug files) to a
// symbol store from a build pipeline: the same extraction and checks as the
// agent, one batched query, then uploads of what the store lacks.
func runUpload(args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("profsym upload", flag.ContinueOnError)
	fs.SetOutput(stderr)
	endpoint := fs.String("endpoint", os.Getenv("PROFSYM_SYMBOLS_ENDPOINT"), "symbol store URL, e.g. http://gateway:8002 (default $PROFSYM_SYMBOLS_ENDPOINT)")
	tokenFile := fs.String("token-file", "", "file holding the bearer token (default: $PROFSYM_SYMBOLS_TOKEN when set)")
	compression := fs.String("compression", "zstd", "DWARF compression: zstd, zlib or none")
	bandwidth := fs.Int64("max-bandwidth", 0, "upload rate limit in bytes per second (0: none)")
	wait := fs.Duration("wait", 2*time.Minute, "how long to wait for ids another uploader is sending")
	timeout := fs.Duration("timeout", 30*time.Minute, "deadline of the whole run's talk with the store (queries, uploads, waits)")
	answer := fs.Duration("response-timeout", time.Minute, "how long one request may wait for the store's answer once sent")
	index := fs.Bool("index", false, "also compile each file's symbol index and store it, so that gateways read it instead of parsing the debug info (docs/symbol-index.md)")
	var dirs listFlag
	fs.Var(&dirs, "debug-file-directory", "where to look for separate debug files by build id (repeatable; default /usr/lib/debug)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: profsym upload --endpoint URL [--token-file F] FILE...\n\n"+
			"Uploads the sections needed to symbolize FILE (its own symbols, or its debug file found by\n"+
			"build id or .gnu_debuglink) to a profsym symbol store, unless the store has them already.")
		fs.PrintDefaults()
	}
	files, err := parseArgs(fs, args)
	if err == flag.ErrHelp {
		return 0
	}
	if err != nil {
		return 2
	}
	if *endpoint == "" || len(files) == 0 {
		fs.Usage()
		return 2
	}
	token := os.Getenv("PROFSYM_SYMBOLS_TOKEN")
	if *tokenFile != "" {
		if token, err = symstore.ReadToken(*tokenFile); err != nil {
			fmt.Fprintf(stderr, "profsym upload: %v\n", err)
			return 2
		}
	}
	if *timeout <= 0 || *answer <= 0 {
		fmt.Fprintln(stderr, "profsym upload: --timeout and --response-timeout must be positive")
		return 2
	}
	client, err := symstore.NewClient(*endpoint, token, uploadHTTPClient(*answer))
	if err != nil {
		fmt.Fprintf(stderr, "profsym upload: %v\n", err)
		return 2
	}
	if *bandwidth > 0 {
		client.Limiter = symstore.NewLimiter(*bandwidth, 0)
	}
	comp := map[string]keepdebug.Compression{"zstd": keepdebug.Zstd, "zlib": keepdebug.Zlib, "none": keepdebug.None}
	c, ok := comp[*compression]
	if !ok {
		fmt.Fprintf(stderr, "profsym upload: --compression %q is not zstd, zlib or none\n", *compression)
		return 2
	}
	if len(dirs) == 0 {
		dirs = listFlag{"/usr/lib/debug"}
	}
	// The deadline starts now, before the extraction: a CI step is bounded
	// as a whole, whatever the store does.
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	scratch, err := os.MkdirTemp("", "profsym-upload-")
	if err != nil {
		fmt.Fprintf(stderr, "profsym upload: %v\n", err)
		return 1
	}
	defer os.RemoveAll(scratch)

	// Extract and verify every file first: a CI job fails before sending
	// anything when one input is wrong.
	type item struct{ file, id, extracted string }
	var items []item
	failed := 0
	for _, file := range files {
		it, err := prepare(file, dirs, scratch, c)
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", file, err)
			failed++
			continue
		}
		items = append(items, item{file, it.id, it.path})
	}
	todo := map[string]item{}
	var ids []string
	for _, it := range items {
		if _, dup := todo[it.id]; !dup {
			ids = append(ids, it.id)
		}
		todo[it.id] = it
	}
	deadline := time.Now().Add(*wait)
	for len(ids) > 0 {
		res, err := client.Missing(ctx, ids)
		if err != nil {
			fmt.Fprintf(stderr, "profsym upload: %v\n", timeoutSays(ctx, err, *timeout))
			return 1
		}
		lease := map[string]string{}
		for _, l := range res.Upload {
			lease[l.BuildID] = l.Token
		}
		pending := map[string]bool{}
		for _, id := range res.Pending {
			pending[id] = true
		}
		var next []string
		for _, id := range ids {
			it := todo[id]
			tok, ok := lease[id]
			switch {
			case pending[id]:
				next = append(next, id) // another uploader holds it: ask again
				continue
			case !ok:
				fmt.Fprintf(stdout, "%s: %s already stored\n", it.file, id)
				continue
			}
			stored, err := client.Upload(ctx, id, symstore.DebugInfo, it.extracted, tok)
			switch {
			case err != nil:
				fmt.Fprintf(stderr, "%s: %v\n", it.file, timeoutSays(ctx, err, *timeout))
				failed++
			case stored:
				st, _ := os.Stat(it.extracted)
				fmt.Fprintf(stdout, "%s: uploaded %s (%d bytes)\n", it.file, id, st.Size())
			default:
				fmt.Fprintf(stdout, "%s: %s already stored\n", it.file, id)
			}
		}
		ids = next
		if len(ids) > 0 {
			if time.Now().After(deadline) {
				for _, id := range ids {
					fmt.Fprintf(stderr, "%s: %s still being uploaded by another client after %v\n", todo[id].file, id, *wait)
				}
				return 1
			}
			select {
			case <-time.After(2 * time.Second):
			case <-ctx.Done():
				fmt.Fprintf(stderr, "profsym upload: %v\n", timeoutSays(ctx, ctx.Err(), *timeout))
				return 1
			}
		}
	}
	if *index {
		var idx []indexItem
		seen := map[string]bool{}
		for _, it := range items {
			if !seen[it.id] {
				seen[it.id] = true
				idx = append(idx, indexItem(it))
			}
		}
		failed += uploadIndexes(ctx, *endpoint, token, *answer, idx, scratch, stdout, stderr)
	}
	if failed > 0 {
		return 1
	}
	return 0
}

// uploadHTTPClient is the default transport with a bound on each answer:
// a store that takes the request and never replies fails that request
// after answer, however long the body took to send (--max-bandwidth).
func uploadHTTPClient(answer time.Duration) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.ResponseHeaderTimeout = answer
	return &http.Client{Transport: tr}
}

// timeoutSays names the flag to raise when the run's deadline ended err.
func timeoutSays(ctx context.Context, err error, timeout time.Duration) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%w (the run's --timeout of %v passed)", err, timeout)
	}
	return err
}

type prepared struct{ id, path string }

// prepare finds the symbols of file, extracts them and runs the store's own
// verification on the result.
func prepare(file string, dirs []string, scratch string, c keepdebug.Compression) (prepared, error) {
	abs, err := filepath.Abs(file)
	if err != nil {
		return prepared{}, err
	}
	f, err := elfx.Open(abs)
	if err != nil {
		return prepared{}, err
	}
	// Stored by GNU build id (what debuginfod asks by); a Go binary linked
	// without one (Go before 1.24, or -ldflags=-B=none) by its Go build id.
	var cand symupload.Candidate
	if raw, err := buildid.GNU(f); err == nil {
		cand.BuildID = buildid.HexString(raw)
	} else if goID, gerr := buildid.Go(f); gerr == nil {
		cand.GoBuildID = goID
	} else {
		f.Close()
		return prepared{}, fmt.Errorf("no GNU build id (link with -Wl,--build-id) and no Go build id: %w", err)
	}
	f.Close()
	key, err := cand.Key()
	if err != nil {
		return prepared{}, err
	}
	id := key.String()
	cand.Path = abs
	src, err := symupload.FindSource("/proc", cand, dirs)
	if err != nil {
		return prepared{}, fmt.Errorf("no symbols for %s: %w", id, err)
	}
	sf, err := elfx.Open(src.Path)
	if err != nil {
		return prepared{}, err
	}
	defer sf.Close()
	out := filepath.Join(scratch, key.ID+".debug")
	w, err := os.Create(out)
	if err != nil {
		return prepared{}, err
	}
	_, err = keepdebug.Write(sf, w, c)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return prepared{}, fmt.Errorf("extracting %s: %w", src.Path, err)
	}
	if rerr := symstore.Verify(out, id, symstore.DebugInfo); rerr != nil {
		return prepared{}, rerr
	}
	return prepared{id: id, path: out}, nil
}
