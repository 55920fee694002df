"""The draft-and-verify loop and what it stands on: the contract it asks of a drafter, the sampling laws,
the verification rules, the draft-length controllers, the cost model, statistics and the prompt cache. It
never imports a drafter."""
