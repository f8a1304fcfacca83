"""``python -m neuron_dra_ultraserver_operator``."""

from neuron_dra_ultraserver_operator.main import main

if __name__ == "__main__":
    raise SystemExit(main())
