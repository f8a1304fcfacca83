"""Shared building blocks of the neuron-dra services."""

DRIVER_NAME = "neuron.aws.com"
