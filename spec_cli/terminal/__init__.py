"""Everything the terminal shows, and the only wing that imports rich: run views, tables, banners, progress
bars, and the chat REPL's input loop."""
