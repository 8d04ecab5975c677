// Command etcd is etcd's own main (etcdmain), built at the version
// kube-apiserver's module requires so both share one dependency graph.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
