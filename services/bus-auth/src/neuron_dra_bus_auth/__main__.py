"""``python -m neuron_dra_bus_auth``."""

from neuron_dra_bus_auth.main import main

if __name__ == "__main__":
    raise SystemExit(main())
