"""Health and failure detection for Neuron nodes: the node probe and the cluster failure detector."""
