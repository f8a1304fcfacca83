"""Health and failure detection for Neuron nodes."""
