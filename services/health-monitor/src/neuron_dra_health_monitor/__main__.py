"""``python -m neuron_dra_health_monitor``: the cluster failure detector."""

from neuron_dra_health_monitor.detector_main import main

raise SystemExit(main())
