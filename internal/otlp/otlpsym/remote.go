package otlpsym

import (
	"strconv"
	"strings"

	"github.com/profsym/profsym/internal/frame"
)

// Remote frames in the style of seeds 000/001 (a Java profiler that defers
// native symbolization): a frame whose method is "<remote>", whose class (in
// OTLP: the function's system name, or a "BUILDID.<remote>" name) is a GNU
// build id in hex, and whose signature ("0x1a2b" or "(0x1a2b)", in the file
// name or the system name) is the PC's offset from the library's load base.
const remoteMethod = "<remote>"

// parseRemote extracts (build id, offset) from a remote frame's strings.
func parseRemote(name, system, file string) (id string, off uint64, ok bool) {
	switch {
	case name == remoteMethod:
	case strings.HasSuffix(name, "."+remoteMethod):
		id = name[:len(name)-len(remoteMethod)-1]
	default:
		return "", 0, false
	}
	offOK := false
	for _, s := range []string{file, system} {
		if o, good := parseOffset(s); good {
			off, offOK = o, true
			break
		}
	}
	if !offOK {
		return "", 0, false
	}
	if id == "" {
		for _, s := range []string{system, file} {
			if isHexID(s) {
				id = s
				break
			}
		}
	}
	id, err := frame.ParseBuildID(id)
	if err != nil {
		return "", 0, false
	}
	return id, off, true
}

func parseOffset(s string) (uint64, bool) {
	s = strings.TrimSpace(s)
	s = strings.TrimSuffix(strings.TrimPrefix(s, "("), ")")
	if !strings.HasPrefix(s, "0x") && !strings.HasPrefix(s, "0X") {
		return 0, false
	}
	if len(s) > 2+16 {
		return 0, false
	}
	v, err := strconv.ParseUint(s[2:], 16, 64)
	return v, err == nil
}

func isHexID(s string) bool {
	_, err := frame.ParseBuildID(s)
	return err == nil
}

// remoteFrame recognizes a remote frame at location i and queues it. Its
// address is relative to the image base; the object translates it on open.
func (s *Symbolizer) remoteFrame(b *batch, i int32) (work, bool) {
	d := b.d
	loc := d.D.LocationTable().At(int(i))
	if loc.Lines().Len() != 1 {
		return work{}, false
	}
	fi := loc.Lines().At(0).FunctionIndex()
	if fi <= 0 || int(fi) >= d.D.FunctionTable().Len() {
		return work{}, false
	}
	fn := d.D.FunctionTable().At(int(fi))
	id, off, ok := parseRemote(d.Str(fn.NameStrindex()), d.Str(fn.SystemNameStrindex()), d.Str(fn.FilenameStrindex()))
	if !ok {
		return work{}, false
	}
	return work{loc: i, obj: b.object(frame.Identity{GNU: id}, false), addr: off, tr: translation{kind: imageBase}}, true
}
