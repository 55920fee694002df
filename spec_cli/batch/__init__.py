"""`spec batch`: many prompts through one pair and one scheduler, JSONL in and JSONL out, resumable.

`lines` reads the input (plain prompts, JSONL requests, or the OpenAI Batch API's request lines) into tasks
checked as the server checks a request; `output` keeps the output file whole and resumable; `runner` runs the
tasks several at a time, as the server's slots do, and hands each result over as it finishes.
"""
