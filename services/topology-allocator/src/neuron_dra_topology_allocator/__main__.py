"""``python -m neuron_dra_topology_allocator``."""

from neuron_dra_topology_allocator.main import main

if __name__ == "__main__":
    raise SystemExit(main())
