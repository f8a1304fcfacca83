# The two commands of the README. Both install what they need (uv, Python packages,
# Kubernetes binaries built from the official sources and cached).
.PHONY: up test down status

up:
	@bash scripts/bootstrap.sh
	uv run neuron-dra dev up $(ARGS)

test:
	bash scripts/test.sh $(ARGS)

down:
	uv run neuron-dra dev down

status:
	uv run neuron-dra dev status
