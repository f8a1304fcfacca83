//go:build tools

// Package tools records the Alertmanager this module builds (the alert receiver of the
// local stack and of the alerting tests), so that go.mod and go.sum pin it. It is never
// compiled into a binary; see README.md for the build command.
package tools

import (
	_ "github.com/prometheus/alertmanager/cmd/alertmanager"
)
