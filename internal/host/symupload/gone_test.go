package symupload

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/profsym/profsym/internal/testfixture"
)

// A process that exits between its sighting and the extraction takes its
// /proc/PID/map_files with it. That is routine on a busy node (every
// short-lived process), so it logs nothing at info level: the file is
// looked for again with later sightings and given up after maxNotFound
// rounds, counted as skipped file_gone, not as a failed extraction.
func TestProcessGoneBeforeExtraction(t *testing.T) {
	bin := testfixture.Build(t, testfixture.Spec{Name: "uploadgone", Lang: "c", Sources: []string{"e2e/hot.c"},
		Args: []string{"-O1", "-g", "-Wl,--build-id", "-DE2E_ID=uploadgone"}})
	id := testfixture.BuildID(t, bin)
	pid := runFixture(t, bin)
	path := mapFilesPath(t, pid, bin)
	if _, err := os.Stat(path); err != nil {
		testfixture.SkipOrFail(t, "cannot open %s while the process runs (needs CAP_CHECKPOINT_RESTORE or CAP_SYS_ADMIN): %v", path, err)
	}
	if err := syscall.Kill(int(pid), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the process to be gone", 5*time.Second, func() bool { _, err := os.Stat(path); return err != nil })

	c := &counts{}
	_, srv := startStore(t, c)
	core, logs := observer.New(zapcore.DebugLevel)
	u := newUploader(t, srv.URL, c, func(cfg *Config) { cfg.Logger = zap.New(core) })
	u.mu.Lock()
	u.ids[id] = &entry{state: running}
	u.mu.Unlock()
	for round := 1; round <= maxNotFound; round++ {
		// As resolve leaves it: the file found, through the process.
		u.mu.Lock()
		u.ids[id].src = &Source{Path: path, Binary: path, Size: 1 << 20}
		u.mu.Unlock()
		u.wg.Add(1)
		u.upload(context.Background(), id, "lease", time.Minute)
	}
	for _, e := range logs.All() {
		if e.Level >= zapcore.InfoLevel {
			t.Errorf("logged at %v: %s %v", e.Level, e.Message, e.ContextMap())
		}
	}
	if logs.FilterMessageSnippet("went away").Len() != maxNotFound {
		t.Errorf("debug lines: %v", logs.All())
	}
	if c.get("failed:extract") != 0 || c.get("skipped:file_gone") != 1 {
		t.Errorf("counts %v: want skipped:file_gone once, no failed extraction", c.m)
	}
}

// mapFilesPath returns /proc/PID/map_files/START-END of bin's first
// mapping in pid.
func mapFilesPath(t *testing.T, pid int64, bin string) string {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 6 && fields[5] == bin {
			return fmt.Sprintf("/proc/%d/map_files/%s", pid, fields[0])
		}
	}
	t.Fatalf("%s not mapped in %d", bin, pid)
	return ""
}

// A file not found drops the id's sightings; the next round, with no new
// sighting, has no candidate at all. That is the file still gone: looked
// for again until maxNotFound rounds, then counted as skipped file_gone.
// It was counted once as skipped with an empty reason, and given up at once.
func TestNoCandidateLeftIsFileGone(t *testing.T) {
	c := &counts{}
	_, srv := startStore(t, c)
	u := newUploader(t, srv.URL, c, nil)
	cand := Candidate{Path: "/nonexistent/profsym-gone", BuildID: "0123456789abcdef0123456789abcdef01234567"}
	key, err := cand.Key()
	if err != nil {
		t.Fatal(err)
	}
	id := key.String()
	u.Observe(cand)
	for round := 1; round <= maxNotFound; round++ {
		u.mu.Lock()
		u.ids[id].state = running // as round leaves it
		u.mu.Unlock()
		if u.resolve(id) {
			t.Fatalf("round %d: resolved a file that does not exist", round)
		}
		if got := c.get("skipped:file_gone"); (round < maxNotFound) != (got == 0) {
			t.Errorf("round %d: skipped:file_gone %d", round, got)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, n := range c.m {
		if k != "skipped:file_gone" || n != 1 {
			t.Errorf("counted %s %d; want only skipped:file_gone, once (all: %v)", k, n, c.m)
		}
	}
}
