"""The synthetic GEMeX release: test and demo data in the real layouts, never imported by a real build."""
