package locate

import (
	"bytes"
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/locate/debuginfod"
)

// Config describes a chain by source names, as the processor and the CLI
// configure it.
type Config struct {
	// Order lists source names (DefaultOrder when empty). Unknown names are
	// an error; a source without what it needs (no debuginfod client, no
	// store) is left out.
	Order []string

	LocalRoot       string
	DebugDirs       []string
	SymbolDirs      []string
	Rescan          time.Duration // symbol directories (0: DefaultRescan)
	MaxIndexedFiles int           // symbol directories (0: DefaultMaxIndexedFiles)
	Debuginfod      *debuginfod.Client
	Store           Source // a symbol store's in-process source, if any
	ProcRoot        string // "" for /proc

	// FetchWait bounds how long a locate waits for a debuginfod download,
	// or a symbol store's copy, in flight (see Query.Since); 0: as long as
	// the context.
	FetchWait time.Duration

	NegativeTTL  time.Duration
	MaxEntries   int
	MaxFileBytes int64
	FileLimits   elfx.Limits // see Options.FileLimits
	Logger       *zap.Logger
}

// Known reports whether name is a source name.
func Known(name string) bool {
	for _, n := range DefaultOrder {
		if n == name {
			return true
		}
	}
	return false
}

// NewFromConfig builds the chain cfg describes.
func NewFromConfig(cfg Config) (*Chain, error) {
	order := cfg.Order
	if len(order) == 0 {
		order = DefaultOrder
	}
	var srcs []Source
	for _, name := range order {
		switch name {
		case SourceProc:
			srcs = append(srcs, Proc{Root: cfg.ProcRoot})
		case SourceLocal:
			srcs = append(srcs, Local{Root: cfg.LocalRoot})
		case SourceDebugDirs:
			srcs = append(srcs, DebugDirs{Dirs: cfg.DebugDirs})
		case SourceSymbolDirs:
			if len(cfg.SymbolDirs) > 0 {
				srcs = append(srcs, NewSymbolDirs(cfg.SymbolDirs, cfg.Rescan, cfg.MaxIndexedFiles))
			}
		case SourceStore:
			if cfg.Store != nil {
				srcs = append(srcs, Waiting(cfg.Store, cfg.FetchWait))
			}
		case SourceDebuginfod:
			if cfg.Debuginfod != nil {
				srcs = append(srcs, Debuginfod{Client: cfg.Debuginfod, Wait: cfg.FetchWait})
			}
		case SourceKernel:
			srcs = append(srcs, Kernel{Release: hostRelease()})
		default:
			return nil, fmt.Errorf("unknown source %q", name)
		}
	}
	return New(Options{Sources: srcs, NegativeTTL: cfg.NegativeTTL, MaxEntries: cfg.MaxEntries,
		MaxFileBytes: cfg.MaxFileBytes, FileLimits: cfg.FileLimits, Logger: cfg.Logger}), nil
}

// hostRelease is this machine's `uname -r` ("" off Linux).
func hostRelease() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return string(bytes.TrimSpace(b))
}
