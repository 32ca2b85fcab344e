"""The synthetic ReXVQA release: test and demo data in the real layout, never imported by a real build."""
