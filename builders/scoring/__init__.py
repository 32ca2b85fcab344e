"""Scoring: answer extraction, prediction files, text metrics, the LLM judge and the evaluate command."""
