"""``python -m neuron_dra_device_plugin``."""

from neuron_dra_device_plugin.main import main

if __name__ == "__main__":
    raise SystemExit(main())
