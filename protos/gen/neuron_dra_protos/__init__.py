"""Generated code of the kubelet's DRA, plugin registration, DRA health and device plugin
services, and of the Kubernetes protobuf messages the slice publisher writes.

Do not edit: ``protos/proto`` holds the sources, ``python -m protos.generate`` rewrites this.

- ``neuron_dra_protos.dra.v1`` / ``.dra.v1beta1``: ``DRAPlugin`` (prepare, unprepare)
- ``neuron_dra_protos.health.v1alpha1``: ``DRAResourceHealth`` (device health stream)
- ``neuron_dra_protos.registration.v1``: ``Registration`` (kubelet plugin watcher)
- ``neuron_dra_protos.deviceplugin.v1beta1``: the device plugin API (``Registration`` with the
  kubelet's device manager, ``DevicePlugin``)
- ``neuron_dra_protos.kube.resource.v1``: ``resource.k8s.io/v1`` ResourceSlice (the fields
  the slice publisher sets) and the ``runtime.Unknown`` envelope of a protobuf request body
"""
