"""Per-node discovery: reads the Neuron hardware, publishes NodeInventory on the bus."""
