package runtimes

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
