"""`spec bench`'s measurements, served to `cli/bench.py` only: each way of drafting against the target alone on one
pair (`speedup`), many requests at once through the scheduler (`concurrency`), and where two greedy texts part,
up to the target's float ties (`ties`, also read by the tests and the benchmark scripts)."""
