//go:build cni13

// STATUS through libcni's own GetStatusNetworkList (libcni >= v1.2; built for v1.3),
// as containerd 2.x asks it to report NetworkReady:
//
//	cni-driver-1.3 status --conf-dir DIR --net NAME [--cni-path DIR[:DIR]]
//
// Exit 0 when every plugin of the list says it is available; otherwise the error on
// stderr (libcni's text, with the plugin's CNI error code and message), exit 1.
//
// Kept in a file of its own, taken before main's verb dispatch, so the status verb
// exists only in the libcni v1.3 build.

package main

import (
	"context"
	"flag"
	"os"

	"github.com/containernetworking/cni/libcni"
)

func init() {
	if len(os.Args) < 2 || os.Args[1] != "status" {
		return
	}
	fs := flag.NewFlagSet("cni-driver status", flag.ContinueOnError)
	confDir := fs.String("conf-dir", "", "directory holding the conflist")
	netName := fs.String("net", "", "network name")
	cniPath := fs.String("cni-path", "/usr/lib/cni", "plugin search path (':'-separated)")
	if err := fs.Parse(os.Args[2:]); err != nil {
		os.Exit(2)
	}
	if *confDir == "" || *netName == "" {
		fail("--conf-dir and --net are required")
	}
	list, err := libcni.LoadConfList(*confDir, *netName)
	if err != nil {
		fail("loading network %q from %s: %v", *netName, *confDir, err)
	}
	cninet := libcni.NewCNIConfig(splitPath(*cniPath), nil)
	if err := cninet.GetStatusNetworkList(context.Background(), list); err != nil {
		fail("status: %v", err)
	}
	os.Exit(0)
}
