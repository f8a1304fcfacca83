# The two commands of the README. Both install what they need (uv, Python packages,
# Kubernetes binaries built from the official sources and cached); scripts/bootstrap.sh is
# sourced in the same shell as the command, so what it installs is on that command's PATH.
.PHONY: up test down status
SHELL := /bin/bash

up:
	@source scripts/bootstrap.sh && neuron-dra dev up $(ARGS)

test:
	bash scripts/test.sh $(ARGS)

down:
	@source scripts/bootstrap.sh >/dev/null && neuron-dra dev down $(ARGS)

status:
	@source scripts/bootstrap.sh >/dev/null && neuron-dra dev status $(ARGS)
