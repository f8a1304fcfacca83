"""The NATS auth callout: Kubernetes ServiceAccount tokens in, signed user JWTs out."""
