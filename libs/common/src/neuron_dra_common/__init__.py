"""Shared building blocks of the neuron-dra services.

The driver's names (``neuron.aws.com``, ``neurondevice<N>``, ``neuronnode``) are in
:mod:`neuron_dra_common.driver`.
"""
