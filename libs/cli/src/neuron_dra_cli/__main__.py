from neuron_dra_cli.main import main

raise SystemExit(main())
