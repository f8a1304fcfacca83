"""``python -m neuron_dra_audit``."""

from neuron_dra_audit.main import main

if __name__ == "__main__":
    raise SystemExit(main())
