"""Tools for testing tessera and its plugins: random-weight model files and conformance kits."""
