//go:build cni13

// GC through libcni's own GCNetworkList (libcni >= v1.2; built for v1.3).

package main

import (
	"context"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

func gcNetworkList(ctx context.Context, paths []string, cacheDir string, list *libcni.NetworkConfigList, valid attachmentList) error {
	args := &libcni.GCArgs{}
	// No --valid leaves the slice nil, which libcni sends as null: what a runtime
	// with no live sandbox sends.
	for _, a := range valid {
		args.ValidAttachments = append(args.ValidAttachments, types.GCAttachment{ContainerID: a[0], IfName: a[1]})
	}
	cninet := libcni.NewCNIConfigWithCacheDir(paths, cacheDir, nil)
	return cninet.GCNetworkList(ctx, list, args)
}
