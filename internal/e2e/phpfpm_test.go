package e2e

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/testfixture"
)

// fcgiGet sends one FastCGI responder request for script with query to
// addr (a PHP-FPM pool) and returns its stdout. FastCGI is a few framed
// records; Go's net/http/fcgi is a server only.
func fcgiGet(addr, script, query string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	w := bufio.NewWriter(c)
	record := func(typ byte, body []byte) {
		h := [8]byte{1, typ, 0, 1}
		binary.BigEndian.PutUint16(h[4:], uint16(len(body)))
		w.Write(h[:])
		w.Write(body)
	}
	record(1, []byte{0, 1, 0, 0, 0, 0, 0, 0}) // BEGIN_REQUEST: responder, close after
	var params []byte
	for _, kv := range [][2]string{
		{"GATEWAY_INTERFACE", "CGI/1.1"},
		{"REQUEST_METHOD", "GET"},
		{"SCRIPT_FILENAME", script},
		{"SCRIPT_NAME", "/" + filepath.Base(script)},
		{"QUERY_STRING", query},
		{"SERVER_PROTOCOL", "HTTP/1.1"},
		{"REMOTE_ADDR", "127.0.0.1"},
		{"SERVER_NAME", "localhost"},
		{"SERVER_PORT", "80"},
	} {
		params = append(params, byte(len(kv[0])), byte(len(kv[1]))) // all shorter than 128
		params = append(params, kv[0]...)
		params = append(params, kv[1]...)
	}
	record(4, params) // PARAMS
	record(4, nil)
	record(5, nil) // STDIN, empty
	if err := w.Flush(); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	var out strings.Builder
	for {
		var h [8]byte
		if _, err := io.ReadFull(r, h[:]); err != nil {
			return out.String(), err
		}
		body := make([]byte, int(binary.BigEndian.Uint16(h[4:]))+int(h[6]))
		if _, err := io.ReadFull(r, body); err != nil {
			return out.String(), err
		}
		switch h[1] {
		case 6: // STDOUT
			out.Write(body[:len(body)-int(h[6])])
		case 3: // END_REQUEST
			return out.String(), nil
		}
	}
}

// fpmWorkers are the pids of master's children (the pool's workers).
func fpmWorkers(t *testing.T, master int) map[int64]bool {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", master, master))
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]bool{}
	for _, f := range strings.Fields(string(b)) {
		pid, _ := strconv.ParseInt(f, 10, 64)
		out[pid] = true
	}
	return out
}

// TestCollectorPHPFPM is the PHP end-to-end runtime test under PHP-FPM,
// as sites run PHP: the distribution with config/default.yaml, then each
// Debian PHP's php-fpm (bookworm's 8.2, trixie's and sid's 8.4) with a
// static pool of two workers (no php.ini; opcache on, its JIT off)
// serving testdata/src/e2e/fpmchain.php and
// fpmwarm.php over FastCGI. Warm-up requests of fpmwarm.php run until the
// output names both workers' warm frames; then two clients each send
// fpmchain.php requests of about 500 ms of {main} -> top -> Chain::mid -> leaf,
// each followed by a short fpmwarm.php request, for 6 s. Every sample of
// the workers from then on must hold that chain with names, the file and
// marked lines, or be in an fpmwarm.php request (issue 28). The
// fpmwarm.php requests take the memory of fpmchain.php's per-request
// {main} op_array, freed at the end of its request, before the collector
// names the frame (about a second later): {main} must still be named,
// and with its own file.
func TestCollectorPHPFPM(t *testing.T) {
	bin := needBuilt(t, "otelcol-profsym", "otelcol")
	for _, c := range []struct{ suite, fpm string }{{"bookworm", "php-fpm8.2"}, {"trixie", "php-fpm8.4"}, {"sid", "php-fpm8.4"}} {
		t.Run(c.suite, func(t *testing.T) {
			root := testfixture.InterpreterChroot(t, "php", c.suite)
			testPHPFPM(t, bin, root, c.fpm)
		})
	}
}

func testPHPFPM(t *testing.T, bin, root, fpmBin string) {
	scripts := testfixture.ChrootCopy(t, root, testfixture.Src(t, "e2e/fpmchain.php"), testfixture.Src(t, "e2e/fpmwarm.php"))
	script, warmScript := scripts[0], scripts[1]
	port := testfixture.FreePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	conf := filepath.Join(root, "tmp", "profsym-fixtures", fmt.Sprintf("fpm-%d.conf", port))
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(`[global]
daemonize = no
error_log = /tmp/profsym-fixtures/fpm-%[1]d.log
pid = /tmp/profsym-fixtures/fpm-%[1]d.pid
[www]
listen = %[2]s
pm = static
pm.max_children = 2
`, port, addr)), 0o644); err != nil {
		t.Fatal(err)
	}
	c, out := startDefaultCollector(t, bin)
	// Opcache on, as sites run FPM (Debian's php.ini turns it on): the
	// scripts' functions and file names then live in shared memory past
	// each request, so they are there when the report names them. Its JIT
	// off (its buffer is 0 by default; said here so the fixture's engine
	// is pinned). The scripts were copied a moment ago: opcache's
	// file_update_protection (2 s by default) would compile them per
	// request, into memory freed at its end, for their first seconds
	// (docs/runtimes.md, PHP's limits).
	fpm := testfixture.ChrootCommand(root, fpmBin, "-n", "-R", "-F", "-y", "/tmp/profsym-fixtures/"+filepath.Base(conf),
		"-d", "zend_extension=opcache", "-d", "opcache.enable=1", "-d", "opcache.jit=off",
		"-d", "opcache.validate_timestamps=0", "-d", "opcache.file_update_protection=0")
	if err := fpm.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fpm.Process.Kill(); _ = fpm.Wait() })
	var workers map[int64]bool
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := fcgiGet(addr, warmScript, "n=2000"); err == nil {
			workers = fpmWorkers(t, fpm.Process.Pid)
			break
		} else if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(root, "tmp", "profsym-fixtures", fmt.Sprintf("fpm-%d.log", port)))
			t.Fatalf("php-fpm does not answer on %s: %v\n%s", addr, err, log)
		}
	}
	if len(workers) != 2 {
		t.Fatalf("php-fpm runs %d workers, want 2: %v", len(workers), workers)
	}

	// Two clients send their requests in turn until stop; wait returns
	// how many of each went through, or the first failure.
	type request struct{ script, query string }
	requests := func(stop <-chan struct{}, turn ...request) (wait func() ([]int, error)) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		n, first := make([]int, len(turn)), error(nil)
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					for i, r := range turn {
						select {
						case <-stop:
							return
						default:
						}
						body, err := fcgiGet(addr, r.script, r.query)
						if err == nil && !strings.HasPrefix(body, "ok ") && !strings.Contains(body, "\r\n\r\nok ") {
							err = fmt.Errorf("%s answered %.200q", filepath.Base(r.script), body)
						}
						mu.Lock()
						if err != nil && first == nil {
							first = err
						}
						n[i]++
						mu.Unlock()
						if err != nil {
							return
						}
					}
				}
			}()
		}
		return func() ([]int, error) { wg.Wait(); return n, first }
	}

	// Warm-up: until each worker's warm frame is named in the output.
	stop := make(chan struct{})
	wait := requests(stop, request{warmScript, "n=40000"})
	warmed := map[int64]bool{}
	for deadline := time.Now().Add(45 * time.Second); len(warmed) < len(workers) && time.Now().Before(deadline); {
		time.Sleep(500 * time.Millisecond)
		eachSampleOf(t, out, workers, func(s sampleOf) {
			for _, f := range s.frames {
				if f.typ == "php" && f.fn == "warm" {
					warmed[s.pid] = true
				}
			}
		})
	}
	close(stop)
	if _, err := wait(); err != nil {
		t.Fatalf("warm-up requests: %v", err)
	}
	if len(warmed) < len(workers) {
		t.Errorf("warm frames named for %d of %d workers in 45 s", len(warmed), len(workers))
	}

	// The measured requests.
	goNs := uint64(time.Now().UnixNano())
	stop = make(chan struct{})
	wait = requests(stop, request{script, "rounds=4000"}, request{warmScript, "n=2000"})
	time.Sleep(6 * time.Second)
	close(stop)
	n, err := wait()
	if err != nil {
		t.Fatalf("requests: %v", err)
	}
	time.Sleep(2500 * time.Millisecond) // the last reports
	c.stop(t)

	chain := []string{"leaf", "Chain::mid", "top", "{main}"}
	marks := fixtureMarks(t, "fpmchain.php", `// L:([A-Za-z:{}]+)`, chain)
	var total, whole, warm int64
	bad := map[string]int64{}
	eachSampleOf(t, out, workers, func(s sampleOf) {
		if s.time < goNs {
			return
		}
		if slices.ContainsFunc(s.frames, func(f userFrame) bool { return f.typ == "php" && f.path == warmScript }) {
			warm += s.n
			return
		}
		total += s.n
		if ok, desc := phpWhole(s.frames, chain, script, marks); ok {
			whole += s.n
		} else {
			bad[desc+" stop="+s.stop] += s.n
		}
	})
	t.Logf("%d fpmchain.php and %d fpmwarm.php requests; %d samples of the workers in fpmchain.php's, %d (%.2f%%) with the whole chain; %d in fpmwarm.php's",
		n[0], n[1], total, whole, 100*float64(whole)/float64(max(total, 1)), warm)
	for desc, k := range bad {
		t.Logf("  %d x %s", k, desc)
	}
	switch {
	case n[1] < 10:
		t.Errorf("%d fpmwarm.php requests between the measured ones, want at least 10", n[1])
	case total < pyMinSamples:
		t.Errorf("%d samples of the workers, want at least %d", total, pyMinSamples)
	case float64(whole) < pyWholeShare*float64(total):
		t.Errorf("%d of %d samples with the whole chain, want %.0f%%", whole, total, 100*pyWholeShare)
	}
	if t.Failed() {
		t.Logf("collector log (tail):\n%s", tail(c.log.String(), 4000))
	}
}
