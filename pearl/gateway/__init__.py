"""PEARL's OpenAI-compatible gateway: HTTP in front of the elastic pool."""
