"""Errors of the ``neuron-dra`` command."""


class CliError(Exception):
    """An error the user can fix; printed as one line, without a traceback."""
