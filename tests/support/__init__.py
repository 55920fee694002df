"""What the tests share besides fixtures: tiny GGUF writers, the exactness helpers, prompts, chat templates, a fake
Hugging Face endpoint, servers and child processes started for a test."""
