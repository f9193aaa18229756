"""The engine adapter: starting vLLM safely, capturing in-flight requests, resuming them."""
