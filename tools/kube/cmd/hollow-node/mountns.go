package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"syscall"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// The kubelet's device manager listens in a fixed folder
// (/var/lib/kubelet/device-plugins, whatever the kubelet's root), and cleans
// it at start: two kubelets on one host would take it from each other. A
// hollow node with --device-plugins-dir therefore runs in a mount namespace of
// its own where that folder is the given directory, bind-mounted; the host's
// mount table is untouched, and device plugins on the host use the directory.

// devicePluginsEnv marks the process started inside the namespace, with the
// directory it binds.
const devicePluginsEnv = "HOLLOW_NODE_DEVICE_PLUGINS_DIR"

// inOwnMountNamespace reports whether this process is the one started by
// reexecInMountNamespace for dir.
func inOwnMountNamespace(dir string) bool {
	return os.Getenv(devicePluginsEnv) == dir
}

// reexecInMountNamespace runs this program again, with the same arguments, in
// a new private mount namespace, passes SIGINT and SIGTERM on, and exits with
// its status. The child dies with this process (Pdeathsig), so killing either
// stops the node. It needs CAP_SYS_ADMIN.
func reexecInMountNamespace(dir string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	// Pdeathsig fires when the thread that started the child ends: keep it.
	runtime.LockOSThread()
	cmd := exec.Command(self, os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), devicePluginsEnv+"="+dir)
	// Go makes the new namespace's mounts private (MS_REC|MS_PRIVATE on /).
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	if err := cmd.Start(); err != nil {
		if errors.Is(err, syscall.EPERM) {
			return fmt.Errorf("--device-plugins-dir needs a mount namespace of its own, which needs root (CAP_SYS_ADMIN): %w", err)
		}
		return fmt.Errorf("--device-plugins-dir: start in a new mount namespace: %w", err)
	}
	go func() {
		for s := range signals {
			_ = cmd.Process.Signal(s)
		}
	}()
	err = cmd.Wait()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			os.Exit(128 + int(ws.Signal()))
		}
		os.Exit(exit.ExitCode())
	}
	if err != nil {
		return err
	}
	os.Exit(0)
	return nil
}

// bindDevicePluginDir mounts dir on the device manager's folder, in this
// process's own mount namespace.
func bindDevicePluginDir(dir string) error {
	target := filepath.Clean(pluginapi.DevicePluginPath)
	if err := os.MkdirAll(target, 0o750); err != nil {
		return err
	}
	if err := syscall.Mount(dir, target, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s on %s: %w", dir, target, err)
	}
	return nil
}
