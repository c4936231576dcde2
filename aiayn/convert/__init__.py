"""Checkpoints from other toolkits as aiayn model folders (full install: torch, transformers, sentencepiece)."""
