"""The only wing that imports `llama_cpp`: models and contexts, memory rollback strategies, RPC workers and
ggml's device registry, the CPU kernel probe, device placement, GGUF reports and re-encoding."""
