"""Slice publisher: NodeInventory events in, each node's pool of ResourceSlices out."""
