package main

import (
	"context"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/server/healthz"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	internalapi "k8s.io/cri-api/pkg/apis"
	pluginwatcherapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/cm/resourceupdates"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/config"
	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager/cache"
	"k8s.io/kubernetes/pkg/kubelet/status"
	schedulerframework "k8s.io/kubernetes/pkg/scheduler/framework"
)

// draContainerManager is kubemark's stub container manager (no cgroups) with
// Dynamic Resource Allocation handed to the kubelet's own DRA manager, so DRA
// plugins register, and claims are prepared and unprepared, exactly as on a
// real node; with devices set, device plugins are served by the kubelet's own
// device manager (registration, ListAndWatch into the node's capacity,
// Allocate at pod admission, its checkpoint), as on a real node. It also
// reports the node's ephemeral storage.
type draContainerManager struct {
	cm.ContainerManager
	dra              *dra.Manager
	devices          *devicemanager.ManagerImpl
	topology         topologymanager.Manager // admits pods: Allocate from the device manager
	ephemeralStorage resource.Quantity
	updatesOnce      sync.Once
	updates          <-chan resourceupdates.Update
}

var _ cm.ContainerManager = &draContainerManager{}

func healthStatusEnabled() bool {
	return utilfeature.DefaultFeatureGate.Enabled(features.ResourceHealthStatus)
}

// newDeviceManager is the kubelet's device manager behind a topology manager
// with the "none" policy (the kubelet's default): pod admission calls the
// device manager's Allocate, hence the plugins' Allocate, for each container.
func newDeviceManager() (*devicemanager.ManagerImpl, topologymanager.Manager, error) {
	// "container": the kubelet's default scope (unused with the none policy).
	topology, err := topologymanager.NewManager(nil, topologymanager.PolicyNone, "container", nil)
	if err != nil {
		return nil, nil, err
	}
	devices, err := devicemanager.NewManagerImpl(nil, topology)
	if err != nil {
		return nil, nil, err
	}
	addHintProvider(topology, devices)
	return devices, topology, nil
}

func (m *draContainerManager) Start(ctx context.Context, node *v1.Node, activePods cm.ActivePodsFunc,
	getNode cm.GetNodeFunc, sourcesReady config.SourcesReady, podStatusProvider status.PodStatusProvider,
	runtimeService internalapi.RuntimeService, localStorageCapacityIsolation bool) error {
	if err := m.ContainerManager.Start(ctx, node, activePods, getNode, sourcesReady, podStatusProvider,
		runtimeService, localStorageCapacityIsolation); err != nil {
		return err
	}
	if m.devices != nil {
		if err := startDevices(ctx, m.devices, devicemanager.ActivePodsFunc(activePods), sourcesReady); err != nil {
			return err
		}
	}
	if m.dra == nil {
		return nil
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
	handlers := map[string]cache.PluginHandler{}
	if m.dra != nil {
		handlers[pluginwatcherapi.DRAPlugin] = m.dra.GetWatcherHandler()
	}
	if m.devices != nil {
		handlers[pluginwatcherapi.DevicePlugin] = m.devices.GetWatcherHandler()
	}
	return handlers
}

func (m *draContainerManager) GetHealthCheckers() []healthz.HealthChecker {
	if m.devices == nil {
		return m.ContainerManager.GetHealthCheckers()
	}
	return []healthz.HealthChecker{m.devices.GetHealthChecker()}
}

// GetDevicePluginResourceCapacity is what the device plugins report
// (capacity, allocatable, resources to remove): the node status reads it.
func (m *draContainerManager) GetDevicePluginResourceCapacity() (v1.ResourceList, v1.ResourceList, []string) {
	if m.devices == nil {
		return m.ContainerManager.GetDevicePluginResourceCapacity()
	}
	return m.devices.GetCapacity()
}

func (m *draContainerManager) UpdatePluginResources(node *schedulerframework.NodeInfo, attrs *lifecycle.PodAdmitAttributes) error {
	if m.devices == nil {
		return m.ContainerManager.UpdatePluginResources(node, attrs)
	}
	return m.devices.UpdatePluginResources(node, attrs)
}

func (m *draContainerManager) GetAllocateResourcesPodAdmitHandler() lifecycle.PodAdmitHandler {
	if m.devices == nil {
		return m.ContainerManager.GetAllocateResourcesPodAdmitHandler()
	}
	return m.topology
}

func (m *draContainerManager) ShouldResetExtendedResourceCapacity() bool {
	if m.devices == nil {
		return m.ContainerManager.ShouldResetExtendedResourceCapacity()
	}
	return m.devices.ShouldResetExtendedResourceCapacity()
}

func (m *draContainerManager) UpdateAllocatedDevices() {
	if m.devices != nil {
		m.devices.UpdateAllocatedDevices()
	}
}

// GetDevices and GetAllocatableDevices serve the pod resources API.
func (m *draContainerManager) GetDevices(podUID, containerName string) []*podresourcesapi.ContainerDevices {
	if m.devices == nil {
		return nil
	}
	return containerDevices(m.devices.GetDevices(podUID, containerName))
}

func (m *draContainerManager) GetAllocatableDevices() []*podresourcesapi.ContainerDevices {
	if m.devices == nil {
		return nil
	}
	return containerDevices(m.devices.GetAllocatableDevices())
}

func containerDevices(devs devicemanager.ResourceDeviceInstances) []*podresourcesapi.ContainerDevices {
	var out []*podresourcesapi.ContainerDevices
	for resourceName, ids := range devs {
		for id := range ids {
			out = append(out, &podresourcesapi.ContainerDevices{ResourceName: resourceName, DeviceIds: []string{id}})
		}
	}
	return out
}

// GetResources is what the runtime is told for a container: the CDI devices of
// its claims, and what the device plugins' Allocate answered (device nodes,
// mounts, environment, annotations, CDI devices).
func (m *draContainerManager) GetResources(ctx context.Context, pod *v1.Pod, container *v1.Container) (*kubecontainer.RunContainerOptions, error) {
	opts := &kubecontainer.RunContainerOptions{}
	if m.dra != nil {
		info, err := m.dra.GetResources(pod, container)
		if err != nil {
			return nil, err
		}
		opts.CDIDevices = append(opts.CDIDevices, info.CDIDevices...)
	}
	if m.devices == nil {
		return opts, nil
	}
	dev, err := deviceRunOptions(ctx, m.devices, pod, container)
	if err != nil || dev == nil {
		return opts, err
	}
	opts.Devices = append(opts.Devices, dev.Devices...)
	opts.Mounts = append(opts.Mounts, dev.Mounts...)
	opts.Envs = append(opts.Envs, dev.Envs...)
	opts.Annotations = append(opts.Annotations, dev.Annotations...)
	opts.CDIDevices = append(opts.CDIDevices, dev.CDIDevices...)
	return opts, nil
}

func (m *draContainerManager) PrepareDynamicResources(ctx context.Context, pod *v1.Pod) error {
	if m.dra == nil {
		return nil
	}
	return m.dra.PrepareResources(ctx, pod)
}

func (m *draContainerManager) UnprepareDynamicResources(ctx context.Context, pod *v1.Pod) error {
	if m.dra == nil {
		return nil
	}
	return m.dra.UnprepareResources(ctx, pod)
}

func (m *draContainerManager) PodMightNeedToUnprepareResources(uid types.UID) bool {
	return m.dra != nil && m.dra.PodMightNeedToUnprepareResources(uid)
}

// GetDynamicResources serves the pod resources API: the devices each claim
// of the container got, as the DRA manager recorded them at prepare time.
func (m *draContainerManager) GetDynamicResources(pod *v1.Pod, container *v1.Container) []*podresourcesapi.DynamicResource {
	if m.dra == nil {
		return nil
	}
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

// UpdateAllocatedResourcesStatus writes device health into the pod status
// (ResourceHealthStatus feature): the device plugins' (ListAndWatch) and the
// DRA plugins' (their health streams).
func (m *draContainerManager) UpdateAllocatedResourcesStatus(pod *v1.Pod, st *v1.PodStatus) {
	if m.devices != nil {
		m.devices.UpdateAllocatedResourcesStatus(pod, st)
	}
	if m.dra != nil && healthStatusEnabled() {
		m.dra.UpdateAllocatedResourcesStatus(pod, st)
	}
}

// Updates tells the kubelet which pods to re-sync after a device health
// change, from either manager. The kubelet asks on every sync loop iteration:
// the channels are merged once.
func (m *draContainerManager) Updates() <-chan resourceupdates.Update {
	m.updatesOnce.Do(func() {
		var sources []<-chan resourceupdates.Update
		if m.devices != nil {
			sources = append(sources, m.devices.Updates())
		}
		if m.dra != nil && healthStatusEnabled() {
			sources = append(sources, m.dra.Updates())
		}
		switch len(sources) {
		case 0:
			m.updates = m.ContainerManager.Updates()
		case 1:
			m.updates = sources[0]
		default:
			merged := make(chan resourceupdates.Update)
			for _, source := range sources {
				go func() {
					for u := range source {
						merged <- u
					}
				}()
			}
			m.updates = merged
		}
	})
	return m.updates
}
