package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"
)

// OCI media types and annotation keys (image-spec v1.1).
const (
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"
	annRefName    = "org.opencontainers.image.ref.name"
	annCreated    = "org.opencontainers.image.created"
)

// entry is one file or directory of the image's file system.
type entry struct {
	path string // absolute, cleaned
	mode int64  // permission bits; 0 with dir means 0755
	dir  bool
	src  string // host file to copy (regular files)
	data []byte // or these bytes
}

// platform is one architecture of the image.
type platform struct {
	arch, variant string
	files         []entry
}

// spec is everything the image is made of.
type spec struct {
	ref       string // what index.json names the image (org.opencontainers.image.ref.name)
	created   time.Time
	user      string
	env       []string
	entry     []string
	labels    map[string]string
	platforms []platform
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Platform    *ociPlatform      `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type ociPlatform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Variant      string `json:"variant,omitempty"`
}

// blob is content-addressed bytes of the layout.
type blob struct {
	digest string
	data   []byte
}

func newBlob(data []byte) blob {
	sum := sha256.Sum256(data)
	return blob{digest: "sha256:" + hex.EncodeToString(sum[:]), data: data}
}

func (b blob) desc(mediaType string) descriptor {
	return descriptor{MediaType: mediaType, Digest: b.digest, Size: int64(len(b.data))}
}

// layerTar writes the entries as one tar, in path order, every parent
// directory first, owned by root, with a fixed time: the same inputs give
// the same bytes, so the same digests.
func layerTar(files []entry, mtime time.Time) ([]byte, error) {
	all := map[string]entry{}
	for _, f := range files {
		p := path.Clean(f.path)
		if !path.IsAbs(p) || p == "/" {
			return nil, fmt.Errorf("image path %q: want an absolute path below /", f.path)
		}
		if _, dup := all[p]; dup {
			return nil, fmt.Errorf("image path %q given twice", p)
		}
		f.path = p
		all[p] = f
	}
	for p := range all {
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if e, ok := all[d]; !ok {
				all[d] = entry{path: d, dir: true}
			} else if !e.dir {
				return nil, fmt.Errorf("image path %q is a file and the directory of %q", d, p)
			}
		}
	}
	names := make([]string, 0, len(all))
	for p := range all {
		names = append(names, p)
	}
	sort.Strings(names)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range names {
		f := all[p]
		hdr := &tar.Header{
			Name:    strings.TrimPrefix(p, "/"),
			Mode:    f.mode,
			ModTime: mtime,
			Format:  tar.FormatPAX,
		}
		var data []byte
		switch {
		case f.dir:
			hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
			if hdr.Mode == 0 {
				hdr.Mode = 0o755
			}
		case f.src != "":
			fi, err := os.Stat(f.src)
			if err != nil {
				return nil, err
			}
			if !fi.Mode().IsRegular() {
				return nil, fmt.Errorf("%s: not a regular file", f.src)
			}
			if data, err = os.ReadFile(f.src); err != nil {
				return nil, err
			}
		default:
			data = f.data
		}
		if !f.dir {
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(data))
			if hdr.Mode == 0 {
				hdr.Mode = 0o644
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// gz compresses without a name or time in the header (gzip's own
// timestamp would make every build a new digest).
func gz(data []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.DefaultCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(data); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only our own types are marshalled
	}
	return b
}

// build makes the blobs of the layout and returns them with index.json:
// index.json names one image index (the ref), which lists one manifest
// per platform, as multi-platform OCI exports do, so a loader picks the
// platform it runs on.
func build(s spec) (blobs []blob, index []byte, err error) {
	if len(s.platforms) == 0 {
		return nil, nil, fmt.Errorf("no platform to build")
	}
	created := s.created.UTC().Format(time.RFC3339)
	var manifests []descriptor
	for _, p := range s.platforms {
		raw, err := layerTar(p.files, s.created)
		if err != nil {
			return nil, nil, err
		}
		zipped, err := gz(raw)
		if err != nil {
			return nil, nil, err
		}
		layer := newBlob(zipped)
		diffID := newBlob(raw).digest
		config := newBlob(mustJSON(map[string]any{
			"created":      created,
			"architecture": p.arch,
			"os":           "linux",
			"variant":      p.variant,
			"config": map[string]any{
				"User":       s.user,
				"Env":        s.env,
				"Entrypoint": s.entry,
				"WorkingDir": "/",
				"Labels":     s.labels,
			},
			"rootfs":  map[string]any{"type": "layers", "diff_ids": []string{diffID}},
			"history": []map[string]string{{"created": created, "created_by": "make image (deploy/image)"}},
		}))
		manifest := newBlob(mustJSON(map[string]any{
			"schemaVersion": 2,
			"mediaType":     mediaManifest,
			"config":        config.desc(mediaConfig),
			"layers":        []descriptor{layer.desc(mediaLayer)},
			"annotations":   map[string]string{annCreated: created},
		}))
		d := manifest.desc(mediaManifest)
		d.Platform = &ociPlatform{Architecture: p.arch, OS: "linux", Variant: p.variant}
		manifests = append(manifests, d)
		blobs = append(blobs, layer, config, manifest)
	}
	list := newBlob(mustJSON(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaIndex,
		"manifests":     manifests,
		"annotations":   map[string]string{annCreated: created},
	}))
	blobs = append(blobs, list)
	top := list.desc(mediaIndex)
	top.Annotations = map[string]string{annRefName: s.ref}
	index = mustJSON(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaIndex,
		"manifests":     []descriptor{top},
	})
	return blobs, index, nil
}

// writeArchive writes an OCI image layout as a tar (an "OCI archive", what
// podman load, skopeo's oci-archive: and docker load read).
func writeArchive(w io.Writer, blobs []blob, index []byte, mtime time.Time) error {
	tw := tar.NewWriter(w)
	put := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: mtime, Typeflag: tar.TypeReg, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	dir := func(name string) error {
		return tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, ModTime: mtime, Typeflag: tar.TypeDir, Format: tar.FormatPAX})
	}
	if err := put("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := put("index.json", index); err != nil {
		return err
	}
	if err := dir("blobs/"); err != nil {
		return err
	}
	if err := dir("blobs/sha256/"); err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, b := range blobs {
		if seen[b.digest] {
			continue
		}
		seen[b.digest] = true
		if err := put("blobs/sha256/"+strings.TrimPrefix(b.digest, "sha256:"), b.data); err != nil {
			return err
		}
	}
	return tw.Close()
}
