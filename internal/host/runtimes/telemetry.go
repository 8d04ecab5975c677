package runtimes

import "io"

// WalkErrors is implemented by a runtime whose BPF walker counts the walks
// it could not finish, by reason.
type WalkErrors interface {
	Errors() map[string]uint64
}

// WalkErrors returns each runtime's walker failures so far, by reason,
// cumulatively (runtimes whose walker counts none are left out).
func (s *Set) WalkErrors() map[string]map[string]uint64 {
	out := map[string]map[string]uint64{}
	if s == nil {
		return out
	}
	for _, r := range s.rts {
		if we, ok := r.(WalkErrors); ok {
			out[r.Kind().String()] = we.Errors()
		}
	}
	return out
}

// Close releases what each runtime holds (the process memory files it
// keeps open for naming); the Set is not used after it.
func (s *Set) Close() {
	if s == nil {
		return
	}
	for _, r := range s.rts {
		if c, ok := r.(io.Closer); ok {
			_ = c.Close()
		}
	}
	if s.labels != nil {
		s.labels.Close()
	}
	for _, w := range s.watch {
		w.Close()
	}
}
