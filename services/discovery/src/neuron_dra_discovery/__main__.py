"""``python -m neuron_dra_discovery``."""

from neuron_dra_discovery.main import main

if __name__ == "__main__":
    raise SystemExit(main())
