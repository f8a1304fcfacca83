"""Node hardware: the model discovery fills, readers for sysfs and ``neuron-ls``, a simulator."""
