//go:build tools

// Package tools records the container runtime this module builds for the local
// stack's real nodes (containerd, its runc shim and the ctr client), so that
// go.mod and go.sum pin it. It is never compiled into a binary; see README.md
// for the build command.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
