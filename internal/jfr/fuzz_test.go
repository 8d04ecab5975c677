package jfr_test

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"

	"github.com/profsym/profsym/internal/jfr"
	"github.com/profsym/profsym/internal/jfr/jfrtest"
	"github.com/profsym/profsym/internal/testfixture"
)

// FuzzParse feeds the reader damaged recordings, seeded from a real JDK 17
// recording and from Datadog-style ones with remote frames. Whatever the
// input, Parse returns (an error or not) without panicking, within limits.
func FuzzParse(f *testing.F) {
	f.Add(sampleRecording(false).Bytes())
	f.Add(sampleRecording(true).Bytes())
	ctx := jfrtest.New(1)
	ctx.ContextAttributes = []string{"http.route"}
	ctx.SampleWith(jfrtest.DatadogMethodSample, 9, 3, 1, map[string]string{"http.route": "/x"}, jfrtest.NativeFrame("f"))
	f.Add(ctx.Bytes())
	if os.Getenv("NOJDK") == "" && (testfixture.InCI() || fileExists("/usr/bin/java")) {
		if b, err := os.ReadFile(jfrtest.RecordJDK(f, 300)); err == nil {
			f.Add(b)
		}
	}
	// Small recordings made by real agents (async-profiler 3 through the
	// Pyroscope agent, with span context; async-profiler's wall-clock
	// samples), when the Go module that ships them can be had.
	if dir, err := jfrtest.PeerTestdataDir(); err == nil {
		for _, name := range []string{"new_spancontext", "wall_tick_sample"} {
			if b, err := gunzip(filepath.Join(dir, name+".jfr.gz")); err == nil {
				f.Add(b)
			}
		}
	}
	lim := jfr.Limits{MaxChunkSize: 8 << 20, MaxStringLen: 4096, MaxArrayLen: 512, MaxPoolEntries: 1 << 16, MaxClasses: 1024, MaxCPEvents: 64, MaxChunks: 8}
	f.Fuzz(func(t *testing.T, b []byte) {
		frames := 0
		_ = jfr.ParseBytes(b, jfr.Options{Limits: lim}, jfr.Visitor{Setting: func(*jfr.Chunk, string, string) error { return nil },
			Sample: func(c *jfr.Chunk, s *jfr.Sample) error {
				st, ok := c.Stack(s.Stack)
				if !ok {
					return nil
				}
				for _, fr := range st.Frames {
					m, _ := c.Method(fr.Method)
					_ = c.ClassName(m.Class) + c.Symbol(m.Name) + c.Symbol(m.Descriptor)
					c.FrameType(fr.Type)
					frames++
				}
				c.Thread(s.Thread)
				c.ThreadState(s.State)
				for _, a := range s.Attrs {
					c.AttributeValue(a.Value)
				}
				return nil
			}})
		if frames > len(b)*8 {
			t.Fatalf("%d frames from %d bytes", frames, len(b))
		}
	})
}

func TestDecompress(t *testing.T) {
	plain := sampleRecording(false).Bytes()
	var gz, zs, l4 bytes.Buffer
	w := gzip.NewWriter(&gz)
	w.Write(plain)
	w.Close()
	zw, _ := zstd.NewWriter(&zs)
	zw.Write(plain)
	zw.Close()
	lw := lz4.NewWriter(&l4)
	lw.Write(plain)
	lw.Close()
	for name, in := range map[string][]byte{"plain": plain, "gzip": gz.Bytes(), "zstd": zs.Bytes(), "lz4": l4.Bytes()} {
		out, err := jfr.Decompress(in, 1<<20)
		if err != nil || !bytes.Equal(out, plain) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// A bomb: 1 GiB of zeros in a few hundred kilobytes stops at the limit.
	bomb := jfrtest.ZstdBomb(1024)
	if _, err := jfr.Decompress(bomb, 16<<20); !errors.Is(err, jfr.ErrLimit) {
		t.Errorf("bomb of %d bytes: %v", len(bomb), err)
	}
	if _, err := jfr.Decompress(gz.Bytes()[:gz.Len()/2], 1<<20); !errors.Is(err, jfr.ErrTruncated) && !errors.Is(err, jfr.ErrCorrupt) {
		t.Errorf("truncated gzip: %v", err)
	}
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func gunzip(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	return io.ReadAll(z)
}
