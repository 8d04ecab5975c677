package symstore

import (
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/profsym/profsym/internal/frame"
)

// Namespace says which identity a stored file is kept under. Each is a
// fixed folder (directory backend), key prefix (S3) and URL path segment,
// so ids of two kinds can never name the same file.
type Namespace string

const (
	// NSBuildID is the GNU build id in hex: the debuginfod protocol's
	// /buildid/ID/..., what gdb, debuginfod-find and other gateways ask by.
	NSBuildID Namespace = "buildid"
	// NSGoBuildID is a Go build id (the `Go` ELF note), for Go binaries
	// linked without a GNU build id (Go's default). The id holds slashes, so
	// the key is its bytes in hex: one path segment, [0-9a-f] only.
	NSGoBuildID Namespace = "gobuildid"
)

// MaxGoKeyBytes bounds a Go build id kept in the store: its hex must fit
// one file name (NAME_MAX 255). The go tool writes 83 bytes today.
const MaxGoKeyBytes = 120

// Key names stored files: a namespace and a validated, lowercase hex id.
// Its String form travels in the missing query ("HEX" for a GNU build id,
// "gobuildid/HEX" for a Go build id); its Path is the folder or object
// prefix and the URL path ("buildid/HEX", "gobuildid/HEX").
type Key struct {
	NS Namespace
	ID string
}

// GNUKey validates a GNU build id given as hex.
func GNUKey(id string) (Key, error) {
	v, err := frame.ParseBuildID(id)
	if err != nil {
		return Key{}, err
	}
	return Key{NSBuildID, v}, nil
}

// GoKey validates a Go build id as a file or mapping carries it.
func GoKey(goID string) (Key, error) {
	v, err := frame.ParseGoBuildID(goID)
	if err != nil {
		return Key{}, err
	}
	if len(v) > MaxGoKeyBytes {
		return Key{}, fmt.Errorf("go build id of %d bytes, at most %d are stored: %w", len(v), MaxGoKeyBytes, frame.ErrInvalidBuildID)
	}
	return Key{NSGoBuildID, hex.EncodeToString([]byte(v))}, nil
}

// ParseKey validates a key in its String form, or as a namespace and an
// id taken from a URL path. Anything else, path-like ids included, is an
// error wrapping frame.ErrInvalidBuildID.
func ParseKey(s string) (Key, error) {
	ns, id, ok := strings.Cut(s, "/")
	if !ok {
		return GNUKey(s)
	}
	return parseNS(Namespace(ns), id)
}

func parseNS(ns Namespace, id string) (Key, error) {
	switch ns {
	case NSBuildID:
		return GNUKey(id)
	case NSGoBuildID:
		if len(id) > 2*MaxGoKeyBytes {
			return Key{}, fmt.Errorf("go build id key of %d hex digits, at most %d: %w", len(id), 2*MaxGoKeyBytes, frame.ErrInvalidBuildID)
		}
		raw, err := hex.DecodeString(id)
		if err != nil {
			return Key{}, fmt.Errorf("go build id key is not hex: %w", frame.ErrInvalidBuildID)
		}
		return GoKey(string(raw))
	}
	return Key{}, fmt.Errorf("namespace %.20q is not %s or %s: %w", ns, NSBuildID, NSGoBuildID, frame.ErrInvalidBuildID)
}

// String is "HEX" for a GNU build id (as the missing query has always
// carried them) and "gobuildid/HEX" otherwise.
func (k Key) String() string {
	if k.NS == NSBuildID {
		return k.ID
	}
	return string(k.NS) + "/" + k.ID
}

// Path is "NAMESPACE/HEX": below the store's root, the bucket prefix, and
// the server's URL.
func (k Key) Path() string { return string(k.NS) + "/" + k.ID }

// GoBuildID returns the Go build id of a gobuildid key.
func (k Key) GoBuildID() string {
	if k.NS != NSGoBuildID {
		return ""
	}
	b, _ := hex.DecodeString(k.ID)
	return string(b)
}

// valid rechecks a key built elsewhere than by the functions above, before
// a backend joins it into a path.
func (k Key) valid() error {
	_, err := parseNS(k.NS, k.ID)
	if err == nil && strings.ToLower(k.ID) != k.ID {
		err = fmt.Errorf("key %q is not lowercase: %w", k.ID, frame.ErrInvalidBuildID)
	}
	return err
}

// namespaces lists every namespace, for listing a backend.
var namespaces = []Namespace{NSBuildID, NSGoBuildID}
