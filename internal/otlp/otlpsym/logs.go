package otlpsym

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"go.opentelemetry.io/collector/pdata/plog"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/locate"
)

// Attribute names of the ProfileEvent log records (docs/frame-format.md).
const (
	LogAttrFrames      = "frames"
	LogAttrTopFunction = "topFunction"
	LogAttrTopMethod   = "topMethod"
	LogAttrTopClass    = "topClass"
	LogAttrStackPath   = "stackPath"
	LogAttrStackTrace  = "stackTrace"
	LogAttrStackDepth  = "stackDepth"
)

// LogFrame is one raw frame of a ProfileEvent record, leaf first.
type LogFrame struct {
	BuildID   string `json:"buildId,omitempty"`
	GoBuildID string `json:"goBuildId,omitempty"`
	FileID    string `json:"fileId,omitempty"` // htlhash
	Address   uint64 `json:"address"`
	File      string `json:"file,omitempty"`
	FrameType string `json:"frameType,omitempty"`
	Function  string `json:"function,omitempty"`
}

// TraceFrame is one entry of the stackTrace attribute (seed 002's shape).
type TraceFrame struct {
	Function string `json:"function"`
	Method   string `json:"method"`
	Class    string `json:"class,omitempty"`
	File     string `json:"file,omitempty"`
	Line     uint32 `json:"line,omitempty"`
	Depth    int    `json:"depth"`
	Address  uint64 `json:"address"`
}

// ParseLogFrames decodes a record's frames attribute: at most maxJSON
// bytes (larger is frame.ErrLimitExceeded), and only the first maxFrames
// frames are kept.
func ParseLogFrames(s string, maxJSON, maxFrames int) ([]LogFrame, error) {
	if len(s) > maxJSON {
		return nil, fmt.Errorf("frames attribute of %d bytes exceeds %d: %w", len(s), maxJSON, frame.ErrLimitExceeded)
	}
	var frames []LogFrame
	if err := json.Unmarshal([]byte(s), &frames); err != nil {
		return nil, fmt.Errorf("frames attribute: %v: %w", err, frame.ErrCorruptFile)
	}
	if len(frames) > maxFrames {
		frames = frames[:maxFrames]
	}
	return frames, nil
}

// Logs fills the names of every ProfileEvent record in ld.
func (s *Symbolizer) Logs(ctx context.Context, ld plog.Logs) Stats {
	var st Stats
	b := &batch{s: s, objs: map[string]*objRef{}}
	type rec struct {
		lr     plog.LogRecord
		frames []LogFrame
		asked  []int32 // per frame: its index in todo, or -1 when not asked
	}
	var recs []rec
	var todo []work
	lim := s.opt.Limits
	for _, rl := range ld.ResourceLogs().All() {
		var pid int64
		var exe string
		if v, ok := rl.Resource().Attributes().Get(frame.AttrPID); ok {
			pid = v.Int()
		}
		if v, ok := rl.Resource().Attributes().Get(frame.AttrExePath); ok {
			exe = v.AsString()
		}
		for _, sl := range rl.ScopeLogs().All() {
			for _, lr := range sl.LogRecords().All() {
				v, ok := lr.Attributes().Get(LogAttrFrames)
				if !ok {
					continue
				}
				frames, err := ParseLogFrames(v.AsString(), lim.MaxFramesJSON, lim.MaxLogFrames)
				if err != nil {
					st.unresolved(frame.Reason(err))
					lr.Attributes().PutStr(frame.AttrError, frame.Reason(err))
					continue
				}
				r := rec{lr: lr, frames: frames, asked: make([]int32, len(frames))}
				for i, f := range frames {
					r.asked[i] = -1
					w := b.logObject(f)
					if w.obj == nil {
						continue // named already, or not native
					}
					if w.obj.fail == nil {
						w.obj.q.AddHint(locate.Hint{File: f.File, PID: pid, ExePath: exe})
					}
					w.addr = f.Address
					r.asked[i] = int32(len(todo))
					todo = append(todo, w)
				}
				recs = append(recs, r)
			}
		}
	}
	if len(recs) == 0 {
		return st
	}
	answers := s.resolve(ctx, b, todo, &st)
	for _, r := range recs {
		var trace []TraceFrame
		reasons, incomplete := map[string]bool{}, map[string]bool{}
		for i, f := range r.frames {
			var lines []rline
			switch {
			case f.Function != "":
				lines = []rline{{fn: s.intern(funcTuple{name: f.Function})}}
				st.Skipped++
			case r.asked[i] < 0:
				st.Skipped++
			default:
				res := answers[r.asked[i]]
				if res.err != nil {
					reasons[frame.Reason(res.err)] = true
				} else if res.missing != "" {
					incomplete[res.missing] = true
				}
				lines = res.lines
			}
			if len(lines) == 0 {
				trace = append(trace, TraceFrame{Function: fmt.Sprintf("0x%x", f.Address), Method: fmt.Sprintf("0x%x", f.Address),
					Depth: len(trace), Address: f.Address})
				continue
			}
			for _, l := range lines {
				class, method := splitName(l.fn.name)
				trace = append(trace, TraceFrame{Function: l.fn.name, Method: method, Class: class,
					File: l.fn.file, Line: l.line, Depth: len(trace), Address: f.Address})
			}
		}
		writeTrace(r.lr, trace, lim.MaxAttributeBytes)
		if len(reasons) > 0 {
			r.lr.Attributes().PutStr(frame.AttrError, strings.Join(slices.Sorted(maps.Keys(reasons)), ","))
		}
		if len(incomplete) > 0 {
			r.lr.Attributes().PutStr(frame.AttrIncomplete, strings.Join(slices.Sorted(maps.Keys(incomplete)), ","))
		}
	}
	return st
}

// logObject returns the object of a log frame, or why it has none; a
// frame of another type, or already named, has neither.
func (b *batch) logObject(f LogFrame) work {
	if f.Function != "" || f.FrameType != "" && f.FrameType != frame.TypeNative {
		return work{}
	}
	id, err := frame.ParseIdentity(f.BuildID, f.GoBuildID, f.FileID)
	if err != nil {
		return work{obj: failed(err)}
	}
	if id.IsZero() {
		return work{obj: failed(fmt.Errorf("frame at %#x has no build id or file id: %w", f.Address, frame.ErrNoMapping))}
	}
	return work{obj: b.object(id, false)}
}

// writeTrace sets the seed-002 fields from the resolved trace (leaf first).
// stackPath and stackTrace each stay within maxBytes: frames are dropped
// from the root end, and the names in them were truncated when interned.
func writeTrace(lr plog.LogRecord, trace []TraceFrame, maxBytes int) {
	if len(trace) == 0 {
		return
	}
	a := lr.Attributes()
	a.PutStr(LogAttrTopFunction, trace[0].Function)
	a.PutStr(LogAttrTopMethod, trace[0].Method)
	a.PutStr(LogAttrTopClass, trace[0].Class)
	var path strings.Builder
	for i, t := range trace {
		sep := ""
		if i > 0 {
			sep = " <- "
		}
		if path.Len()+len(sep)+len(t.Method) > maxBytes {
			break
		}
		path.WriteString(sep)
		path.WriteString(t.Method)
	}
	a.PutStr(LogAttrStackPath, path.String())
	n := len(trace)
	b, _ := json.Marshal(trace)
	for len(b) > maxBytes && n > 1 {
		n = n * maxBytes / len(b) // a proportional first guess, then step
		n = max(1, min(n, len(trace)-1))
		b, _ = json.Marshal(trace[:n])
		for len(b) > maxBytes && n > 1 {
			n--
			b, _ = json.Marshal(trace[:n])
		}
	}
	if len(b) <= maxBytes {
		a.PutStr(LogAttrStackTrace, string(b))
	}
	a.PutInt(LogAttrStackDepth, int64(len(trace)))
	if comm, ok := a.Get("comm"); ok {
		lr.Body().SetStr(frame.Truncate(fmt.Sprintf("%s: %s", comm.AsString(), trace[0].Function), maxBytes))
	}
}

// splitName splits a function name into its class or package and its
// method: "runtime.goexit" -> ("runtime", "goexit"), "ns::Cls::f(int)" ->
// ("ns::Cls", "f"), "org.Foo::bar" -> ("org.Foo", "bar").
func splitName(full string) (class, method string) {
	s := full
	// Drop a parameter list and what follows (C++ signatures, clone suffixes).
	if i := topLevelParen(s); i > 0 {
		s = s[:i]
	}
	depth := 0
	for i := len(s) - 1; i >= 0; i-- {
		switch s[i] {
		case '>', ')', ']':
			depth++
		case '<', '(', '[':
			depth--
		case ':':
			if depth == 0 && i > 0 && s[i-1] == ':' {
				return s[:i-1], s[i+1:]
			}
		case '.':
			if depth == 0 && i > 0 && i < len(s)-1 {
				return s[:i], s[i+1:]
			}
		case '/':
			if depth == 0 {
				return "", s[i+1:]
			}
		}
	}
	return "", s
}

// topLevelParen finds the '(' that opens a C++ parameter list, skipping
// template arguments and "(anonymous namespace)".
func topLevelParen(s string) int {
	depth := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '<':
			depth++
		case '>':
			depth--
		case '(':
			if depth == 0 && i > 0 && !strings.HasPrefix(s[i:], "(anonymous namespace)") {
				return i
			}
		}
	}
	return -1
}
