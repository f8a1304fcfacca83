package main

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	internalapi "k8s.io/cri-api/pkg/apis"
	pluginwatcherapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/cm/resourceupdates"
	"k8s.io/kubernetes/pkg/kubelet/config"
	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager/cache"
	"k8s.io/kubernetes/pkg/kubelet/status"
)

// draContainerManager is kubemark's stub container manager (no cgroups, no
// devices) with Dynamic Resource Allocation handed to the kubelet's own DRA
// manager, so DRA plugins register, and claims are prepared and unprepared,
// exactly as on a real node. It also reports the node's ephemeral storage.
type draContainerManager struct {
	cm.ContainerManager
	dra              *dra.Manager
	ephemeralStorage resource.Quantity
}

var _ cm.ContainerManager = &draContainerManager{}

func healthStatusEnabled() bool {
	return utilfeature.DefaultFeatureGate.Enabled(features.ResourceHealthStatus)
}

func (m *draContainerManager) Start(ctx context.Context, node *v1.Node, activePods cm.ActivePodsFunc,
	getNode cm.GetNodeFunc, sourcesReady config.SourcesReady, podStatusProvider status.PodStatusProvider,
	runtimeService internalapi.RuntimeService, localStorageCapacityIsolation bool) error {
	if err := m.ContainerManager.Start(ctx, node, activePods, getNode, sourcesReady, podStatusProvider,
		runtimeService, localStorageCapacityIsolation); err != nil {
		return err
	}
	return m.dra.Start(ctx, dra.ActivePodsFunc(activePods), dra.GetNodeFunc(getNode), sourcesReady)
}

func (m *draContainerManager) GetCapacity(localStorageCapacityIsolation bool) v1.ResourceList {
	if !localStorageCapacityIsolation {
		return v1.ResourceList{}
	}
	return v1.ResourceList{v1.ResourceEphemeralStorage: m.ephemeralStorage.DeepCopy()}
}

func (m *draContainerManager) GetPluginRegistrationHandlers() map[string]cache.PluginHandler {
	return map[string]cache.PluginHandler{pluginwatcherapi.DRAPlugin: m.dra.GetWatcherHandler()}
}

func (m *draContainerManager) GetResources(ctx context.Context, pod *v1.Pod, container *v1.Container) (*kubecontainer.RunContainerOptions, error) {
	info, err := m.dra.GetResources(pod, container)
	if err != nil {
		return nil, err
	}
	return &kubecontainer.RunContainerOptions{CDIDevices: info.CDIDevices}, nil
}

func (m *draContainerManager) PrepareDynamicResources(ctx context.Context, pod *v1.Pod) error {
	return m.dra.PrepareResources(ctx, pod)
}

func (m *draContainerManager) UnprepareDynamicResources(ctx context.Context, pod *v1.Pod) error {
	return m.dra.UnprepareResources(ctx, pod)
}

func (m *draContainerManager) PodMightNeedToUnprepareResources(uid types.UID) bool {
	return m.dra.PodMightNeedToUnprepareResources(uid)
}

// GetDynamicResources serves the pod resources API: the devices each claim
// of the container got, as the DRA manager recorded them at prepare time.
func (m *draContainerManager) GetDynamicResources(pod *v1.Pod, container *v1.Container) []*podresourcesapi.DynamicResource {
	infos, err := m.dra.GetContainerClaimInfos(pod, container)
	if err != nil {
		return nil
	}
	out := make([]*podresourcesapi.DynamicResource, 0, len(infos))
	for _, info := range infos {
		res := &podresourcesapi.DynamicResource{ClaimName: info.ClaimName, ClaimNamespace: info.Namespace}
		for driver, ds := range info.DriverState {
			for _, d := range ds.Devices {
				cr := &podresourcesapi.ClaimResource{DriverName: driver, PoolName: d.PoolName, DeviceName: d.DeviceName}
				for _, id := range d.CDIDeviceIDs {
					cr.CdiDevices = append(cr.CdiDevices, &podresourcesapi.CDIDevice{Name: id})
				}
				res.ClaimResources = append(res.ClaimResources, cr)
			}
		}
		out = append(out, res)
	}
	return out
}

// UpdateAllocatedResourcesStatus writes device health from the plugins'
// health streams into the pod status (ResourceHealthStatus feature).
func (m *draContainerManager) UpdateAllocatedResourcesStatus(pod *v1.Pod, st *v1.PodStatus) {
	if healthStatusEnabled() {
		m.dra.UpdateAllocatedResourcesStatus(pod, st)
	}
}

// Updates tells the kubelet which pods to re-sync after a device health change.
func (m *draContainerManager) Updates() <-chan resourceupdates.Update {
	if healthStatusEnabled() {
		return m.dra.Updates()
	}
	return m.ContainerManager.Updates()
}
