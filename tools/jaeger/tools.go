//go:build tools

// Package tools records the trace backend this module builds (Jaeger v2, an
// OpenTelemetry Collector distribution with Jaeger's storage and query API), so
// that go.mod and go.sum pin it. It is never compiled into a binary; see
// README.md for the build command.
package tools

import (
	_ "github.com/jaegertracing/jaeger/cmd/jaeger"
)
