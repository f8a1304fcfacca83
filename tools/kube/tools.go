//go:build tools

// Package tools records the upstream programs this module builds, so that
// go.mod and go.sum pin them together with the hollow node. It is never
// compiled into a binary; see README.md for the build commands.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/test/e2e/dra/test-driver"
)
