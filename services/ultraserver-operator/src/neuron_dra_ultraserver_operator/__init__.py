"""UltraServer operator: NeuronUltraServer discovery and NeuronUltraServerWorkload reconciliation."""
