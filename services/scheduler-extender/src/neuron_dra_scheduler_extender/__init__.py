"""The Neuron scheduler extender: filter, prioritize and bind over kube-scheduler's extender API."""
