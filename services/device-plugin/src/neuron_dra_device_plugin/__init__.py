"""The per-node kubelet device plugin (device plugin API v1beta1) for Neuron devices and cores.

Pure modules (``inventory``, ``choose``, ``respond``, ``pending``) hold the logic; ``health``
keeps the devices' health from its sources; ``servicer`` and ``registration`` speak gRPC to the
kubelet, ``annotations`` reads the scheduler extension's pod annotations, ``bushealth`` follows
the health monitor's events; ``wiring`` puts them together and ``main`` starts it.
"""
