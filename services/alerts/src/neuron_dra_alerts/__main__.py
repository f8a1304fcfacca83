"""``python -m neuron_dra_alerts``."""

from neuron_dra_alerts.main import main

if __name__ == "__main__":
    raise SystemExit(main())
