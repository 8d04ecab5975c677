package frame

import "fmt"

// Identity names one file by what it says about itself: its GNU build id,
// its Go build id and its OpenTelemetry htlhash (hex, lowercase). Any may be
// empty. A mapping carries the identity of the file it mapped; a file found
// on some machine is used for it only when the identities match.
type Identity struct {
	GNU, Go, HTL string
}

// ParseIdentity validates the identity attributes of a mapping as received
// (hostile input): a GNU build id and an htlhash are hex of 4 to 64 bytes, a
// Go build id printable base64 with slashes. An invalid one is an error
// wrapping ErrInvalidBuildID; nothing from it is kept.
func ParseIdentity(gnu, goID, htl string) (Identity, error) {
	var id Identity
	var err error
	if gnu != "" {
		if id.GNU, err = ParseBuildID(gnu); err != nil {
			return Identity{}, fmt.Errorf("gnu: %w", err)
		}
	}
	if goID != "" {
		if id.Go, err = ParseGoBuildID(goID); err != nil {
			return Identity{}, fmt.Errorf("go: %w", err)
		}
	}
	if htl != "" {
		if id.HTL, err = ParseBuildID(htl); err != nil {
			return Identity{}, fmt.Errorf("htlhash: %w", err)
		}
	}
	return id, nil
}

// IsZero reports whether no identity is known.
func (id Identity) IsZero() bool { return id.GNU == "" && id.Go == "" && id.HTL == "" }

// Key is the identity as one string, for maps and caches: the strongest id
// present, prefixed by its kind.
func (id Identity) Key() string {
	switch {
	case id.GNU != "":
		return "g:" + id.GNU
	case id.Go != "":
		return "o:" + id.Go
	case id.HTL != "":
		return "h:" + id.HTL
	}
	return ""
}

func (id Identity) String() string { return id.Key() }

// Matches reports whether a file whose own identity is file is the file id
// names. A GNU build id decides when both sides have one, else the Go build
// id, else the htlhash. Nothing in common is no match.
func (id Identity) Matches(file Identity) bool {
	switch {
	case id.GNU != "" && file.GNU != "":
		return id.GNU == file.GNU
	case id.Go != "" && file.Go != "":
		return id.Go == file.Go
	case id.HTL != "" && file.HTL != "":
		return id.HTL == file.HTL
	}
	return false
}

// MatchesDebug is Matches for a separate debug file, which shares its
// binary's GNU and Go build ids but not its htlhash (the bytes differ).
func (id Identity) MatchesDebug(file Identity) bool {
	switch {
	case id.GNU != "" && file.GNU != "":
		return id.GNU == file.GNU
	case id.Go != "" && file.Go != "":
		return id.Go == file.Go
	}
	return false
}
