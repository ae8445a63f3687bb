"""The backend conformance kit: every op of a backend checked against the numpy reference."""
