"""``python -m neuron_dra_scheduler_extender``."""

from neuron_dra_scheduler_extender.main import main

if __name__ == "__main__":
    raise SystemExit(main())
