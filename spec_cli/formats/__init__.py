"""What a model reads and writes beyond plain tokens: constraints made from schemas and grammars (`structured`),
what a chat template says of its model (`dialect`), each family's tool-call convention (`conventions`), and the
user's text made valid Unicode (`user_text`). Above the public API (`request`), below the faces."""
