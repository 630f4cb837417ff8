"""``make soak``: bounded load and faults at twice the saturation, on Locust (docs/soak.md)."""
