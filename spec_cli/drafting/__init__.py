"""Ways of drafting, one module each, behind the contract `decoding.drafter` states; `modes` is the one
registry of drafting modes that the pair, the commands and the server read."""
