//go:build !unix

package locate

import "errors"

func mkfifo(string) error { return errors.ErrUnsupported }
