//go:build k8s1_34

package main

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace/noop"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	internalapi "k8s.io/cri-api/pkg/apis"
	remote "k8s.io/cri-client/pkg"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/config"
)

// connectRuntime opens the CRI client to the fake runtime (1.34 signature).
func connectRuntime(ctx context.Context, endpoint string) (internalapi.RuntimeService, error) {
	logger := klog.FromContext(ctx)
	return remote.NewRemoteRuntimeService(endpoint, 15*time.Second, noop.NewTracerProvider(), &logger)
}

// startDevices starts the device manager (1.34 signature).
func startDevices(_ context.Context, m *devicemanager.ManagerImpl, activePods devicemanager.ActivePodsFunc, sourcesReady config.SourcesReady) error {
	return m.Start(activePods, sourcesReady, containermap.NewContainerMap(), sets.New[string]())
}

func addHintProvider(t topologymanager.Manager, m *devicemanager.ManagerImpl) {
	t.AddHintProvider(m)
}

func deviceRunOptions(_ context.Context, m *devicemanager.ManagerImpl, pod *v1.Pod, container *v1.Container) (*devicemanager.DeviceRunContainerOptions, error) {
	return m.GetDeviceRunContainerOptions(pod, container)
}
