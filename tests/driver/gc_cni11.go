//go:build !cni13

// libcni v1.1 has no GCNetworkList: the gc command says so instead of faking it.

package main

import (
	"context"
	"errors"

	"github.com/containernetworking/cni/libcni"
)

func gcNetworkList(ctx context.Context, paths []string, cacheDir string, list *libcni.NetworkConfigList, valid attachmentList) error {
	return errors.New("this driver is built on libcni v1.1, which has no GCNetworkList (build with -tags cni13 on libcni v1.3)")
}
