//go:build linux

package locate

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/profsym/profsym/internal/addrmap"
)

// Proc opens the mapping's file through a live process on this host: the
// frame's resource names the process (process.pid), /proc/PID/maps tells
// which of its files has the mapping's base name at the mapping's file
// offset (the upstream eBPF profiler sends base names and ELF-space
// addresses, so neither a path nor a run-time address is there to match),
// and the file is opened through /proc/PID/map_files/START-END (which
// reaches files in other mount namespaces and deleted ones) or else
// /proc/PID/root/PATH, resolved inside that root. The chain then checks the
// file's build id or htlhash against the mapping's, so a reused pid or
// another host's pid never names a frame wrongly. It applies on the host
// that sampled, while the process lives: in an agent, or `profsym record
// --symbolize`, not in a gateway.
type Proc struct {
	// Root is where /proc is ("" for /proc); tests point it elsewhere.
	Root string
}

// maxPID is the kernel's PID_MAX_LIMIT: larger ids are not processes.
const maxPID = 1 << 22

// maxMapsLines bounds the mappings read per process (a JVM can have tens of
// thousands; nothing has millions).
const maxMapsLines = 1 << 20

func (Proc) Name() string { return SourceProc }

func (p Proc) Find(_ context.Context, q *Query) ([]Candidate, error) {
	if q.Kernel {
		return nil, nil
	}
	// The first process still there that maps the file is enough.
	for _, h := range q.Hints {
		if out := p.find(h); len(out) > 0 {
			return out, nil
		}
	}
	return nil, nil
}

func (p Proc) find(h Hint) []Candidate {
	if h.PID <= 0 || h.PID > maxPID {
		return nil
	}
	name := filepath.Base(h.File)
	if h.File == "" || name == "." || name == "/" {
		if h.ExePath == "" {
			return nil
		}
		name = filepath.Base(h.ExePath)
	}
	proc := p.Root
	if proc == "" {
		proc = "/proc"
	}
	dir := filepath.Join(proc, strconv.FormatInt(h.PID, 10))
	fh, err := os.Open(filepath.Join(dir, "maps"))
	if err != nil {
		return nil // gone, or not ours to read: nothing to offer
	}
	defer fh.Close()
	var exact, byName []addrmap.Mapping
	lines := 0
	errStop := errors.New("stop")
	err = addrmap.ParseMaps(bufio.NewReader(fh), func(m addrmap.Mapping) error {
		if lines++; lines > maxMapsLines {
			return errStop
		}
		if !m.IsFile() || filepath.Base(m.Path) != name {
			return nil
		}
		if m.Offset == h.FileOffset {
			exact = append(exact, m)
		} else {
			byName = append(byName, m)
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return nil
	}
	ms := exact
	if len(ms) == 0 {
		ms = byName
	}
	var out []Candidate
	seen := map[string]bool{}
	root := filepath.Join(dir, "root")
	for _, m := range ms {
		if seen[m.Path] {
			continue
		}
		seen[m.Path] = true
		hostDir := ""
		if hp, err := InRoot(root, filepath.Dir(m.Path)); err == nil {
			hostDir = hp
		}
		c := Candidate{Dir: filepath.Dir(m.Path), HostDir: hostDir}
		mf := filepath.Join(dir, "map_files", fmt.Sprintf("%x-%x", m.Start, m.End))
		if _, err := os.Stat(mf); err == nil {
			c.Path = mf
			out = append(out, c)
			continue
		}
		if hp, err := InRoot(root, m.Path); err == nil {
			if _, err := os.Stat(hp); err == nil {
				c.Path = hp
				out = append(out, c)
			}
		}
	}
	return out
}
