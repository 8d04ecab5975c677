package otlpsym

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"go.opentelemetry.io/collector/pdata/plog"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/symbolize"
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

// Bounds on what a log record may carry: it is untrusted input.
const (
	maxFramesJSON = 1 << 20
	maxLogFrames  = 1024
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

// ParseLogFrames decodes a record's frames attribute, with bounds.
func ParseLogFrames(s string) ([]LogFrame, error) {
	if len(s) > maxFramesJSON {
		return nil, fmt.Errorf("frames attribute of %d bytes exceeds %d: %w", len(s), maxFramesJSON, frame.ErrCorruptFile)
	}
	var frames []LogFrame
	if err := json.Unmarshal([]byte(s), &frames); err != nil {
		return nil, fmt.Errorf("frames attribute: %v: %w", err, frame.ErrCorruptFile)
	}
	if len(frames) > maxLogFrames {
		frames = frames[:maxLogFrames]
	}
	return frames, nil
}

// Logs fills the names of every ProfileEvent record in ld.
func (s *Symbolizer) Logs(ctx context.Context, ld plog.Logs) Stats {
	var st Stats
	objs := map[string]*objRef{}
	type rec struct {
		lr     plog.LogRecord
		frames []LogFrame
	}
	var recs []rec
	need := map[*objRef]bool{}
	for _, rl := range ld.ResourceLogs().All() {
		for _, sl := range rl.ScopeLogs().All() {
			for _, lr := range sl.LogRecords().All() {
				v, ok := lr.Attributes().Get(LogAttrFrames)
				if !ok {
					continue
				}
				frames, err := ParseLogFrames(v.AsString())
				if err != nil {
					st.unresolved(frame.Reason(err))
					lr.Attributes().PutStr(frame.AttrError, frame.Reason(err))
					continue
				}
				for _, f := range frames {
					if o := logObject(f, objs); o != nil {
						if o.num == 0 {
							o.num = s.objNum(o.key)
						}
						k, ok := keyOf(o.num, f.Address)
						if !ok {
							need[o] = true
						} else if _, hit := s.results.Get(k); !hit {
							need[o] = true
						}
					}
				}
				recs = append(recs, rec{lr, frames})
			}
		}
	}
	if len(recs) == 0 {
		return st
	}
	s.openAll(ctx, need)
	defer func() {
		for o := range need {
			if o.h != nil {
				o.h.Close()
			}
		}
	}()
	var buf []symbolize.Frame
	for _, r := range recs {
		var trace []TraceFrame
		reasons := map[string]bool{}
		for _, f := range r.frames {
			o := logObject(f, objs)
			var lines []rline
			switch {
			case f.Function != "":
				lines = []rline{{fn: &funcTuple{name: f.Function}}}
				st.Skipped++
			case o == nil:
				st.Skipped++
			default:
				res := s.resolve(o, f.Address, translation{}, &buf, &st)
				if res.err != nil {
					reasons[frame.Reason(res.err)] = true
					st.unresolved(frame.Reason(res.err))
				} else {
					st.Resolved++
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
		writeTrace(r.lr, trace)
		if len(reasons) > 0 {
			var rs []string
			for k := range reasons {
				rs = append(rs, k)
			}
			r.lr.Attributes().PutStr(frame.AttrError, strings.Join(sortStrings(rs), ","))
		}
	}
	return st
}

func logObject(f LogFrame, objs map[string]*objRef) *objRef {
	if f.FrameType != "" && f.FrameType != frame.TypeNative {
		return nil
	}
	id := ids{gnu: strings.ToLower(f.BuildID), goid: f.GoBuildID, htl: strings.ToLower(f.FileID)}
	key := id.key()
	if key == "" {
		return nil
	}
	if o, ok := objs[key]; ok {
		return o
	}
	o := &objRef{id: id, file: f.File, key: key}
	objs[key] = o
	return o
}

// writeTrace sets the seed-002 fields from the resolved trace (leaf first).
func writeTrace(lr plog.LogRecord, trace []TraceFrame) {
	if len(trace) == 0 {
		return
	}
	a := lr.Attributes()
	a.PutStr(LogAttrTopFunction, trace[0].Function)
	a.PutStr(LogAttrTopMethod, trace[0].Method)
	a.PutStr(LogAttrTopClass, trace[0].Class)
	parts := make([]string, len(trace))
	for i, t := range trace {
		parts[i] = t.Method
	}
	a.PutStr(LogAttrStackPath, strings.Join(parts, " <- "))
	b, _ := json.Marshal(trace)
	a.PutStr(LogAttrStackTrace, string(b))
	a.PutInt(LogAttrStackDepth, int64(len(trace)))
	if comm, ok := a.Get("comm"); ok {
		lr.Body().SetStr(fmt.Sprintf("%s: %s", comm.AsString(), trace[0].Function))
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

func sortStrings(s []string) []string {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	return s
}
