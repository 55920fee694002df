"""What the faces say about a run and a machine, written once so that every face says it the same way: a
generation's statistics in words (`summary`), and the facts `spec models` and `spec doctor` show (`models`).
Plain data and text: `terminal` renders them."""
