package symbolize

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/profsym/profsym/internal/dwarf"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
)

// SplitRequest asks for the file holding an object's split units
// (-gsplit-dwarf): its .dwp package when DWOName is empty, else the .dwo
// file one skeleton unit names.
type SplitRequest struct {
	Files            []string // the object's binary and debug file
	DWOName, CompDir string   // the skeleton's: untrusted
}

// splitTimeout bounds finding and opening one split file: it happens in
// a lookup, which has no context of its own.
const splitTimeout = 30 * time.Second

// splitFiles finds an object's split units: in its package, opened once
// and kept with the object, or in the .dwo file each skeleton names,
// opened for the time its unit is read.
type splitFiles struct {
	find  func(context.Context, SplitRequest) (string, error)
	files []string
	lim   elfx.Limits
	open  func(context.Context, string, elfx.Limits) (*elfx.File, error)

	// self is the file holding the skeletons: its own package when it
	// carries one (an uploaded debug file with its split units packed in).
	self *elfx.File

	once sync.Once
	dwpF *elfx.File
	dwp  *dwarf.DWP
}

func (s *splitFiles) package_() *dwarf.DWP {
	s.once.Do(func() {
		if s.self != nil && s.self.HasSection(".debug_cu_index") {
			if d, err := dwarf.OpenDWP(s.self); err == nil {
				s.dwp = d
				return
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), splitTimeout)
		defer cancel()
		if s.find == nil {
			return
		}
		p, err := s.find(ctx, SplitRequest{Files: s.files})
		if err != nil {
			return
		}
		f, err := s.open(ctx, p, s.lim)
		if err != nil {
			return
		}
		d, err := dwarf.OpenDWP(f)
		if err != nil {
			f.Close()
			return
		}
		s.dwpF, s.dwp = f, d
	})
	return s.dwp
}

// unit is the dwarf.SplitFinder of the object.
func (s *splitFiles) unit(sk dwarf.Skeleton) (dwarf.SplitSections, func(), error) {
	var pkgErr error
	if d := s.package_(); d != nil {
		ss, err := d.Sections(sk.ID)
		if err == nil {
			return ss, nil, nil
		}
		pkgErr = err
	}
	if s.find == nil {
		if pkgErr == nil {
			pkgErr = fmt.Errorf("split unit %.200q: no package and no way to find its file: %w", sk.DWOName, frame.ErrNotFound)
		}
		return dwarf.SplitSections{}, nil, pkgErr
	}
	ctx, cancel := context.WithTimeout(context.Background(), splitTimeout)
	defer cancel()
	p, err := s.find(ctx, SplitRequest{Files: s.files, DWOName: sk.DWOName, CompDir: sk.CompDir})
	if err != nil {
		if pkgErr != nil {
			return dwarf.SplitSections{}, nil, pkgErr
		}
		return dwarf.SplitSections{}, nil, err
	}
	f, err := s.open(ctx, p, s.lim)
	if err != nil {
		return dwarf.SplitSections{}, nil, classify(err)
	}
	ss, err := dwarf.DWOSections(f)
	if err != nil {
		f.Close()
		return dwarf.SplitSections{}, nil, err
	}
	return ss, func() { f.Close() }, nil
}

func (s *splitFiles) close() {
	if s != nil && s.dwpF != nil {
		s.dwpF.Close()
	}
}

func (s *splitFiles) heldBytes() int64 {
	if s == nil || s.dwpF == nil {
		return 0
	}
	return s.dwpF.HeldBytes()
}
