"""The Hub: validate a built folder, preview it, and publish it with access rules."""
