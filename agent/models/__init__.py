"""The model adapters, one per wire, and the request shapes they send (providers.py).
Above history only."""
