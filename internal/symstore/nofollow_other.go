//go:build !unix

package symstore

// noFollow: no O_NOFOLLOW here; stored files are still checked to be
// regular after the open.
const noFollow = 0
