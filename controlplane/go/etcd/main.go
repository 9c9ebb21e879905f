// Command etcd: the etcd server from the pinned go.etcd.io/etcd/server/v3 module. etcd's own main
// package lives in a module that cannot be required (go.etcd.io/etcd/v3 uses local replaces), so this
// is the same one line it runs.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
