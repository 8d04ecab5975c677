package symbolstoreextension

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/extension/extensiontest"

	"github.com/profsym/profsym/internal/testfixture"
)

// BenchmarkServeDebuginfo serves a 256 MiB stored file through the
// extension's real confighttp server over loopback, side by side with
// reading the same file from the page cache, and reports both rates and
// their ratio (1 = serving at disk speed). Ranges are served the same way.
func BenchmarkServeDebuginfo(b *testing.B) {
	const size = 256 << 20
	dir := b.TempDir()
	id := "00112233445566778899aabbccddeeff00112233"
	p := filepath.Join(dir, "buildid", id, "debuginfo")
	os.MkdirAll(filepath.Dir(p), 0o755)
	f, _ := os.Create(p)
	io.CopyN(f, rand.Reader, size)
	f.Close()

	cfg := createDefaultConfig()
	cfg.ServerConfig.NetAddr.Endpoint = fmt.Sprintf("127.0.0.1:%d", testfixture.FreePort(b))
	cfg.Storage.Directory = dir
	ext, err := newStore(extensiontest.NewNopSettings(NewFactory().Type()), cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := ext.Start(context.Background(), componenttest.NewNopHost()); err != nil {
		b.Fatal(err)
	}
	defer ext.Shutdown(context.Background())
	url := "http://" + cfg.ServerConfig.NetAddr.Endpoint + "/buildid/" + id + "/debuginfo"

	var disk, served time.Duration
	for i := 0; i < b.N; i++ {
		start := time.Now()
		f, _ := os.Open(p)
		io.Copy(io.Discard, f)
		f.Close()
		disk += time.Since(start)

		start = time.Now()
		resp, err := http.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		served += time.Since(start)
		if n != size {
			b.Fatalf("served %d bytes", n)
		}
	}
	mb := float64(size) / (1 << 20) * float64(b.N)
	b.ReportMetric(mb/disk.Seconds(), "disk_MB/s")
	b.ReportMetric(mb/served.Seconds(), "served_MB/s")
	b.ReportMetric(disk.Seconds()/served.Seconds(), "served/disk")
}
