"""``python -m neuron_dra_slice_publisher``."""

from neuron_dra_slice_publisher.main import main

if __name__ == "__main__":
    raise SystemExit(main())
