package jfrtest

import (
	"bytes"
	"fmt"
	"mime/multipart"
	"net/textproto"

	"github.com/klauspost/compress/zstd"
)

// DatadogUpload builds what dd-trace-java's ProfileUploader posts to
// /profiling/v1/input: an `event` JSON part (attachments, tags_profiler,
// family, version) and the recording as the file main.jfr. It returns the
// body and its Content-Type.
func DatadogUpload(tags string, recording []byte) (*bytes.Buffer, string) {
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", `form-data; name="event"; filename="event.json"`)
	h.Set("Content-Type", "application/json")
	pw, _ := mw.CreatePart(h)
	fmt.Fprintf(pw, `{"attachments":["main.jfr"],"tags_profiler":%q,"start":"2026-11-23T10:00:00Z","end":"2026-11-23T10:01:00Z","family":"java","version":"4"}`, tags)
	h = textproto.MIMEHeader{}
	h.Set("Content-Disposition", `form-data; name="main"; filename="main.jfr"`)
	h.Set("Content-Type", "application/octet-stream")
	pw, _ = mw.CreatePart(h)
	pw.Write(recording)
	mw.Close()
	return &buf, mw.FormDataContentType()
}

// Zstd compresses b as dd-trace-java does by default.
func Zstd(b []byte) []byte {
	var out bytes.Buffer
	w, _ := zstd.NewWriter(&out)
	w.Write(b)
	w.Close()
	return out.Bytes()
}

// ZstdBomb is a zstd stream of a few hundred kilobytes that expands to mib
// MiB of zeros.
func ZstdBomb(mib int) []byte {
	var out bytes.Buffer
	w, _ := zstd.NewWriter(&out, zstd.WithEncoderLevel(zstd.SpeedFastest))
	zero := make([]byte, 1<<20)
	for i := 0; i < mib; i++ {
		w.Write(zero)
	}
	w.Close()
	return out.Bytes()
}
