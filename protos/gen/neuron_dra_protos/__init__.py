"""Generated gRPC code of the kubelet's DRA, plugin registration and DRA health services.

Do not edit: ``protos/proto`` holds the sources, ``python -m protos.generate`` rewrites this.

- ``neuron_dra_protos.dra.v1`` / ``.dra.v1beta1``: ``DRAPlugin`` (prepare, unprepare)
- ``neuron_dra_protos.health.v1alpha1``: ``DRAResourceHealth`` (device health stream)
- ``neuron_dra_protos.registration.v1``: ``Registration`` (kubelet plugin watcher)
"""
