"""The local stack: a real control plane, simulated Neuron nodes and NATS on one machine."""
