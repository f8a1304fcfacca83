"""neuron-dra-alerts: alerts in Alertmanager for device faults, lost nodes and degraded workloads."""
