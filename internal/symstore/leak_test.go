package symstore

import (
	"testing"

	"go.uber.org/goleak"
)

// The package starts goroutines; none may outlive its tests. Kept-alive
// client connections are not counted: the tests' requests go through the
// default transport, and the S3 client library keeps a connection pool per
// client that it gives no way to close (the store's own server-side
// goroutines are still checked).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"))
}
