"""neuron-dra health monitoring: the node probe (and the cluster failure detector)."""
