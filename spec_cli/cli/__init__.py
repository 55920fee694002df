"""The `spec` command line: Typer commands that parse, build a request, call the library and hand what it
yields to `terminal`. Thin: no engine logic here."""
