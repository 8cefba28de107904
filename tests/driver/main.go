// cni-driver: a tiny container-runtime stand-in built on libcni, the library
// containerd, CRI-O and cnitool use. Integration tests of cni-ledger drive
// conflists through it so the ledger is exercised exactly as a runtime would.
//
// Build (GOPATH mode, Debian's golang-github-appc-cni-dev; the package is this
// directory, and the tag cni13 adds what needs libcni >= v1.2, i.e. gc):
//
//	GO111MODULE=off GOPATH=/usr/share/gocode go build -o cni-driver ./tests/driver
//	GO111MODULE=off GOPATH=<libcni 1.3 gocode> go build -tags cni13 -o cni-driver-1.3 ./tests/driver
//
// Usage:
//
//	cni-driver add|del|check --conf-dir DIR --net NAME --cid ID --ifname IF
//	           [--netns PATH] [--cni-path DIR[:DIR]] [--cache-dir DIR]
//	           [--cap-args JSON] [--args "K=V;K2=V2"]
//	cni-driver load --conf-dir DIR --net NAME
//	cni-driver gc --conf-dir DIR --net NAME [--valid CID/IF]... [--timeout SECS]
//	           [--cni-path DIR[:DIR]] [--cache-dir DIR]
//
// add prints the result JSON on stdout; load prints the plugin types of the
// parsed conflist as a JSON array; gc runs GCNetworkList with the --valid
// attachments (none given: an empty, nil list) under a context deadline of
// --timeout seconds (0: none), as a runtime's GC call would. Any error: message
// on stderr, exit 1.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
)

func fail(format string, a ...interface{}) {
	fmt.Fprintf(os.Stderr, "cni-driver: "+format+"\n", a...)
	os.Exit(1)
}

func usage() {
	fmt.Fprintln(os.Stderr, `usage:
  cni-driver add|del|check --conf-dir DIR --net NAME --cid ID --ifname IF [--netns PATH]
             [--cni-path DIR[:DIR]] [--cache-dir DIR] [--cap-args JSON] [--args "K=V;K2=V2"]
  cni-driver load --conf-dir DIR --net NAME
  cni-driver gc --conf-dir DIR --net NAME [--valid CID/IF]... [--timeout SECS]
             [--cni-path DIR[:DIR]] [--cache-dir DIR]`)
	os.Exit(2)
}

func parseArgs(s string) ([][2]string, error) {
	var out [][2]string
	if s == "" {
		return out, nil
	}
	for _, kv := range strings.Split(s, ";") {
		if kv == "" {
			continue
		}
		parts := strings.SplitN(kv, "=", 2)
		if len(parts) != 2 {
			return nil, fmt.Errorf("invalid --args element %q (want K=V)", kv)
		}
		out = append(out, [2]string{parts[0], parts[1]})
	}
	return out, nil
}

// attachmentList is a repeatable --valid CID/IFNAME flag. An interface name
// cannot hold '/', so the last one splits.
type attachmentList [][2]string

func (a *attachmentList) String() string { return fmt.Sprint(*a) }

func (a *attachmentList) Set(v string) error {
	i := strings.LastIndex(v, "/")
	if i <= 0 || i == len(v)-1 {
		return fmt.Errorf("invalid --valid %q (want CONTAINERID/IFNAME)", v)
	}
	*a = append(*a, [2]string{v[:i], v[i+1:]})
	return nil
}

func splitPath(s string) []string {
	var paths []string
	for _, p := range strings.Split(s, ":") {
		if p != "" {
			paths = append(paths, p)
		}
	}
	return paths
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	verb := os.Args[1]
	fs := flag.NewFlagSet("cni-driver "+verb, flag.ContinueOnError)
	confDir := fs.String("conf-dir", "", "directory holding the conflist")
	netName := fs.String("net", "", "network name")
	cid := fs.String("cid", "", "container ID")
	ifname := fs.String("ifname", "", "interface name")
	netns := fs.String("netns", "", "network namespace path")
	cniPath := fs.String("cni-path", "/usr/lib/cni", "plugin search path (':'-separated)")
	cacheDir := fs.String("cache-dir", "/var/lib/cni", "libcni cache directory")
	capArgs := fs.String("cap-args", "", "capability args as a JSON object")
	cniArgs := fs.String("args", "", "CNI_ARGS as K=V;K2=V2")
	var valid attachmentList
	fs.Var(&valid, "valid", "gc: a valid attachment CONTAINERID/IFNAME (repeatable)")
	timeout := fs.Int("timeout", 0, "gc: the call's deadline in seconds (0: none)")
	if err := fs.Parse(os.Args[2:]); err != nil {
		os.Exit(2)
	}
	if fs.NArg() != 0 {
		fail("unexpected arguments: %v", fs.Args())
	}
	if *confDir == "" || *netName == "" {
		fail("--conf-dir and --net are required")
	}

	list, err := libcni.LoadConfList(*confDir, *netName)
	if err != nil {
		fail("loading network %q from %s: %v", *netName, *confDir, err)
	}

	if verb == "load" {
		types := []string{}
		for _, p := range list.Plugins {
			types = append(types, p.Network.Type)
		}
		out, _ := json.Marshal(types)
		fmt.Println(string(out))
		return
	}

	if verb == "gc" {
		ctx := context.Background()
		if *timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, time.Duration(*timeout)*time.Second)
			defer cancel()
		}
		if err := gcNetworkList(ctx, splitPath(*cniPath), *cacheDir, list, valid); err != nil {
			fail("gc: %v", err)
		}
		return
	}

	if verb != "add" && verb != "del" && verb != "check" {
		usage()
	}
	if *cid == "" || *ifname == "" {
		fail("--cid and --ifname are required")
	}

	rt := &libcni.RuntimeConf{
		ContainerID: *cid,
		NetNS:       *netns,
		IfName:      *ifname,
	}
	if rt.Args, err = parseArgs(*cniArgs); err != nil {
		fail("%v", err)
	}
	if *capArgs != "" {
		m := map[string]interface{}{}
		if err := json.Unmarshal([]byte(*capArgs), &m); err != nil {
			fail("invalid --cap-args: %v", err)
		}
		rt.CapabilityArgs = m
	}

	cninet := libcni.NewCNIConfigWithCacheDir(splitPath(*cniPath), *cacheDir, nil)
	ctx := context.Background()

	switch verb {
	case "add":
		res, err := cninet.AddNetworkList(ctx, list, rt)
		if err != nil {
			fail("add: %v", err)
		}
		out, err := json.Marshal(res)
		if err != nil {
			fail("encoding result: %v", err)
		}
		fmt.Println(string(out))
	case "del":
		if err := cninet.DelNetworkList(ctx, list, rt); err != nil {
			fail("del: %v", err)
		}
	case "check":
		if err := cninet.CheckNetworkList(ctx, list, rt); err != nil {
			fail("check: %v", err)
		}
	}
}
