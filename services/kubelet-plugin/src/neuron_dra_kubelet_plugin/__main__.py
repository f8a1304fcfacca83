"""``python -m neuron_dra_kubelet_plugin``."""

from neuron_dra_kubelet_plugin.main import main

if __name__ == "__main__":
    raise SystemExit(main())
