"""One module per scenario, each with ``run(*, quick: bool) -> Report``."""
