"""Topology allocator: whole-UltraServer placement for NeuronUltraServerWorkloads."""
