"""The test suite; its shared builds and tiny models are modules of this package."""
