package symstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/profsym/profsym/internal/frame"
)

// S3Config configures the S3-compatible backend.
type S3Config struct {
	Endpoint        string // host:port
	Bucket          string
	Prefix          string // key prefix, e.g. "profsym/"
	Region          string
	AccessKeyID     string
	SecretAccessKey string
	Insecure        bool // plain http
	// CreateBucket makes the bucket at start when it does not exist.
	CreateBucket bool
	Transport    http.RoundTripper
}

// S3 stores files as objects PREFIX/NAMESPACE/ID/KIND in one bucket, so
// gateways that scale out share one store. Upload leases are objects too,
// PREFIX/leases/NAMESPACE/ID (index builds: PREFIX/leases/symindex/...), written with conditional puts (If-None-Match
// to take a free lease, If-Match on the ETag read to take over an expired
// one), so that replicas over one bucket hand each out once. Where the
// server ignores or refuses conditional writes (found at start), leases
// stay in each store's memory.
type S3 struct {
	cfg    S3Config
	client *minio.Client
	// conditional is whether the server honours If-None-Match and If-Match
	// on PutObject.
	conditional bool
	probeErr    error
}

// NewS3 connects and checks the bucket (creating it when asked): a wrong
// secret or a missing bucket fails here, at start, not at the first upload.
func NewS3(ctx context.Context, cfg S3Config) (*S3, error) {
	if cfg.Endpoint == "" || cfg.Bucket == "" {
		return nil, errors.New("s3 backend: endpoint and bucket are required")
	}
	c, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds:     credentials.NewStaticV4(cfg.AccessKeyID, cfg.SecretAccessKey, ""),
		Secure:    !cfg.Insecure,
		Region:    cfg.Region,
		Transport: cfg.Transport,
	})
	if err != nil {
		return nil, fmt.Errorf("s3 backend: %w", err)
	}
	s := &S3{cfg: cfg, client: c}
	ok, err := c.BucketExists(ctx, cfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("s3 backend: bucket %s at %s: %w", cfg.Bucket, cfg.Endpoint, err)
	}
	if !ok {
		if !cfg.CreateBucket {
			return nil, fmt.Errorf("s3 backend: bucket %s does not exist at %s", cfg.Bucket, cfg.Endpoint)
		}
		if err := c.MakeBucket(ctx, cfg.Bucket, minio.MakeBucketOptions{Region: cfg.Region}); err != nil {
			return nil, fmt.Errorf("s3 backend: creating bucket %s: %w", cfg.Bucket, err)
		}
	}
	s.conditional, s.probeErr = s.probeConditional(ctx)
	return s, nil
}

// probeConditional writes one object twice with If-None-Match: *. The
// second write must fail with 412; a server that ignores the header (as
// versitygw does without its metadata store) or refuses it cannot hold
// leases.
func (s *S3) probeConditional(ctx context.Context) (bool, error) {
	k := path.Join(s.cfg.Prefix, "leases", ".probe-"+newToken())
	defer s.client.RemoveObject(context.WithoutCancel(ctx), s.cfg.Bucket, k, minio.RemoveObjectOptions{})
	for i := 0; i < 2; i++ {
		opts := minio.PutObjectOptions{DisableMultipart: true, ContentType: "text/plain"}
		opts.SetMatchETagExcept("*")
		_, err := s.client.PutObject(ctx, s.cfg.Bucket, k, strings.NewReader("probe"), 5, opts)
		switch {
		case i == 0 && err != nil:
			return false, fmt.Errorf("conditional put refused: %w", err)
		case i == 1 && err == nil:
			return false, errors.New("the server ignored If-None-Match: a second conditional put of one object succeeded")
		case i == 1 && minio.ToErrorResponse(err).StatusCode != http.StatusPreconditionFailed:
			return false, fmt.Errorf("conditional put of an existing object: %w", err)
		}
	}
	return true, nil
}

// LeasesShared reports whether leases live in the bucket.
func (s *S3) LeasesShared() bool { return s.conditional }

// Conditional says why leases are not shared, when they are not.
func (s *S3) Conditional() (bool, error) { return s.conditional, s.probeErr }

// leaseBody is the content of a lease object. Expiry is by the replicas'
// clocks, which must agree to well within a lease (NTP does).
type leaseBody struct {
	Token   string    `json:"token"`
	Expires time.Time `json:"expires"`
}

// leaseKey names the lease object: PREFIX/leases/NAMESPACE/ID for an
// upload, PREFIX/leases/symindex/NAMESPACE/ID for an index build. The
// second level is a namespace or "symindex", never both, so the two leases
// of one id are distinct objects.
func (s *S3) leaseKey(name LeaseName) (string, error) {
	if err := name.Key.valid(); err != nil {
		return "", err
	}
	switch name.For {
	case "":
		return path.Join(s.cfg.Prefix, "leases", name.Key.Path()), nil
	case SymIndex:
		return path.Join(s.cfg.Prefix, "leases", string(SymIndex), name.Key.Path()), nil
	}
	return "", fmt.Errorf("lease for %q: %w", name.For, frame.ErrInvalidPath)
}

// maxLeaseBody bounds what is read of a lease object.
const maxLeaseBody = 4096

// readLease returns the lease on k and its ETag; fs.ErrNotExist when none.
// One request: the body and the ETag are of one version (minio-go's
// Object would re-request with If-Match and fail on a lease rewritten
// meanwhile).
func (s *S3) readLease(ctx context.Context, k string) (leaseBody, string, error) {
	body, info, _, err := minio.Core{Client: s.client}.GetObject(ctx, s.cfg.Bucket, k, minio.GetObjectOptions{})
	if err != nil {
		return leaseBody{}, "", notExist(err)
	}
	defer body.Close()
	b, err := io.ReadAll(io.LimitReader(body, maxLeaseBody))
	if err != nil {
		return leaseBody{}, "", err
	}
	var l leaseBody
	// A lease that does not parse (truncated, foreign) counts as expired.
	_ = json.Unmarshal(b, &l)
	return l, info.ETag, nil
}

// writeLease puts the lease on k: only if there is none (etag ""), or only
// over the version with etag. It reports false when the condition failed.
func (s *S3) writeLease(ctx context.Context, k, etag, token string, ttl time.Duration) (bool, error) {
	b, _ := json.Marshal(leaseBody{Token: token, Expires: time.Now().Add(ttl)})
	opts := minio.PutObjectOptions{DisableMultipart: true, ContentType: "application/json"}
	if etag == "" {
		opts.SetMatchETagExcept("*")
	} else {
		opts.SetMatchETag(etag)
	}
	_, err := s.client.PutObject(ctx, s.cfg.Bucket, k, bytes.NewReader(b), int64(len(b)), opts)
	switch code := minio.ToErrorResponse(err).StatusCode; {
	case err == nil:
		return true, nil
	case code == http.StatusPreconditionFailed || code == http.StatusConflict:
		return false, nil // 409: a concurrent conditional write won (S3)
	case etag != "" && code == http.StatusNotFound:
		return false, nil // the lease went away meanwhile
	}
	return false, err
}

// AcquireLease takes a free lease with If-None-Match, and an expired or
// our own with If-Match on the ETag just read: of replicas racing for one
// lease, one write succeeds.
func (s *S3) AcquireLease(ctx context.Context, name LeaseName, token string, ttl time.Duration) (bool, error) {
	k, err := s.leaseKey(name)
	if err != nil {
		return false, err
	}
	for attempt := 0; attempt < 3; attempt++ {
		ok, err := s.writeLease(ctx, k, "", token, ttl)
		if err != nil || ok {
			return ok, err
		}
		l, etag, err := s.readLease(ctx, k)
		if errors.Is(err, fs.ErrNotExist) {
			continue // released meanwhile: try a free lease again
		}
		if err != nil {
			return false, err
		}
		if l.Token != token && time.Now().Before(l.Expires) {
			return false, nil
		}
		return s.writeLease(ctx, k, etag, token, ttl)
	}
	return false, nil
}

// ExtendLease rewrites token's lease over the version read.
func (s *S3) ExtendLease(ctx context.Context, name LeaseName, token string, ttl time.Duration) (bool, error) {
	k, err := s.leaseKey(name)
	if err != nil {
		return false, err
	}
	l, etag, err := s.readLease(ctx, k)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil || l.Token != token {
		return false, err
	}
	return s.writeLease(ctx, k, etag, token, ttl)
}

// ReleaseLease deletes token's lease. Between the read and the delete the
// lease is token's and unexpired, so nobody else can have taken it.
func (s *S3) ReleaseLease(ctx context.Context, name LeaseName, token string) error {
	k, err := s.leaseKey(name)
	if err != nil {
		return err
	}
	l, _, err := s.readLease(ctx, k)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil || l.Token != token {
		return err
	}
	return s.client.RemoveObject(ctx, s.cfg.Bucket, k, minio.RemoveObjectOptions{})
}

func (s *S3) String() string { return "s3 " + s.cfg.Endpoint + "/" + s.cfg.Bucket + "/" + s.cfg.Prefix }

func (s *S3) key(key Key, kind Kind) (string, error) {
	if err := key.valid(); err != nil {
		return "", err
	}
	if _, ok := validKind(string(kind)); !ok {
		return "", fmt.Errorf("kind %q: %w", kind, frame.ErrInvalidPath)
	}
	return path.Join(s.cfg.Prefix, key.Path(), string(kind)), nil
}

func (s *S3) List(ctx context.Context, fn func(Key, Kind, int64)) error {
	for _, ns := range namespaces {
		prefix := path.Join(s.cfg.Prefix, string(ns)) + "/"
		for o := range s.client.ListObjects(ctx, s.cfg.Bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
			if o.Err != nil {
				return o.Err
			}
			parts := strings.Split(strings.TrimPrefix(o.Key, prefix), "/")
			if len(parts) != 2 {
				continue
			}
			key, err := parseNS(ns, parts[0])
			kind, ok := validKind(parts[1])
			if err != nil || !ok || key.ID != parts[0] {
				continue
			}
			fn(key, kind, o.Size)
		}
	}
	return nil
}

func notExist(err error) error {
	if minio.ToErrorResponse(err).StatusCode == http.StatusNotFound {
		return fmt.Errorf("%v: %w", err, fs.ErrNotExist)
	}
	return err
}

func (s *S3) Stat(ctx context.Context, key Key, kind Kind) (int64, error) {
	k, err := s.key(key, kind)
	if err != nil {
		return 0, err
	}
	info, err := s.client.StatObject(ctx, s.cfg.Bucket, k, minio.StatObjectOptions{})
	if err != nil {
		return 0, notExist(err)
	}
	return info.Size, nil
}

func (s *S3) Put(ctx context.Context, key Key, kind Kind, p string, size int64) error {
	k, err := s.key(key, kind)
	if err != nil {
		return err
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	defer os.Remove(p)
	ct := "application/x-elf"
	if kind == SymIndex {
		ct = "application/octet-stream"
	}
	_, err = s.client.PutObject(ctx, s.cfg.Bucket, k, f, size, minio.PutObjectOptions{
		ContentType:      ct,
		DisableMultipart: size < 64<<20,
	})
	return err
}

func (s *S3) Open(ctx context.Context, key Key, kind Kind) (Object, error) {
	k, err := s.key(key, kind)
	if err != nil {
		return nil, err
	}
	o, err := s.client.GetObject(ctx, s.cfg.Bucket, k, minio.GetObjectOptions{})
	if err != nil {
		return nil, notExist(err)
	}
	info, err := o.Stat()
	if err != nil {
		o.Close()
		return nil, notExist(err)
	}
	return &s3Object{Object: o, size: info.Size, mod: info.LastModified}, nil
}

func (s *S3) LocalPath(Key, Kind) (string, bool) { return "", false }

type s3Object struct {
	*minio.Object
	size int64
	mod  time.Time
}

func (o *s3Object) Size() int64        { return o.size }
func (o *s3Object) ModTime() time.Time { return o.mod }
