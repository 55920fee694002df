"""`spec serve`: OpenAI's HTTP API over one pair. Thin like the CLI: it checks requests, calls
`Pair.generate`, and turns `TokenEvent`s into JSON and server-sent events."""
