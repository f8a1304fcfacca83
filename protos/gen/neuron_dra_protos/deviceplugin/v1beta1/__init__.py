"""Generated from protos/proto; do not edit."""
