"""Where model files come from and what they are: the registry of pairs (models.toml and the user's file),
Hugging Face downloads, derived (re-encoded) models, vocabulary checks and the reports `spec models` and
`spec doctor` show."""
