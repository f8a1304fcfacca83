"""The ``neuron-dra`` command."""
