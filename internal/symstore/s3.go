package symstore

import (
	"context"
	"errors"
	"fmt"
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

// S3 stores files as objects PREFIX/buildid/ID/KIND in one bucket, so
// gateways that scale out share one store.
type S3 struct {
	cfg    S3Config
	client *minio.Client
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
	return s, nil
}

func (s *S3) String() string { return "s3 " + s.cfg.Endpoint + "/" + s.cfg.Bucket + "/" + s.cfg.Prefix }

func (s *S3) key(id string, kind Kind) (string, error) {
	if _, err := frame.ParseBuildID(id); err != nil {
		return "", err
	}
	if _, ok := ParseKind(string(kind)); !ok {
		return "", fmt.Errorf("kind %q: %w", kind, frame.ErrInvalidPath)
	}
	return path.Join(s.cfg.Prefix, "buildid", id, string(kind)), nil
}

func (s *S3) List(ctx context.Context, fn func(string, Kind, int64)) error {
	prefix := path.Join(s.cfg.Prefix, "buildid") + "/"
	for o := range s.client.ListObjects(ctx, s.cfg.Bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if o.Err != nil {
			return o.Err
		}
		parts := strings.Split(strings.TrimPrefix(o.Key, prefix), "/")
		if len(parts) != 2 {
			continue
		}
		id, err := frame.ParseBuildID(parts[0])
		kind, ok := ParseKind(parts[1])
		if err != nil || !ok || id != parts[0] {
			continue
		}
		fn(id, kind, o.Size)
	}
	return nil
}

func notExist(err error) error {
	if minio.ToErrorResponse(err).StatusCode == http.StatusNotFound {
		return fmt.Errorf("%v: %w", err, fs.ErrNotExist)
	}
	return err
}

func (s *S3) Stat(ctx context.Context, id string, kind Kind) (int64, error) {
	k, err := s.key(id, kind)
	if err != nil {
		return 0, err
	}
	info, err := s.client.StatObject(ctx, s.cfg.Bucket, k, minio.StatObjectOptions{})
	if err != nil {
		return 0, notExist(err)
	}
	return info.Size, nil
}

func (s *S3) Put(ctx context.Context, id string, kind Kind, p string, size int64) error {
	k, err := s.key(id, kind)
	if err != nil {
		return err
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	defer os.Remove(p)
	_, err = s.client.PutObject(ctx, s.cfg.Bucket, k, f, size, minio.PutObjectOptions{
		ContentType:      "application/x-elf",
		DisableMultipart: size < 64<<20,
	})
	return err
}

func (s *S3) Open(ctx context.Context, id string, kind Kind) (Object, error) {
	k, err := s.key(id, kind)
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

func (s *S3) LocalPath(string, Kind) (string, bool) { return "", false }

type s3Object struct {
	*minio.Object
	size int64
	mod  time.Time
}

func (o *s3Object) Size() int64        { return o.size }
func (o *s3Object) ModTime() time.Time { return o.mod }
