"""neuron-dra-audit: every event of the audit stream as a CloudEvents JSON line."""
