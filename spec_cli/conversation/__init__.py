"""A conversation with a pair, shared by `spec chat` and the server: the chat template rendered turn by turn, the
history and its slash commands (`session`), and the tokens already in the caches that the next turn extends
(`prompt_cache`). No terminal I/O here."""
