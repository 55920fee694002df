"""The OpenAI request layer that `server/` and `batch/` both stand on, neither importing the other: request shapes
and their parsing (`openai_api`), shaped errors (`errors`), image parts (`images`), tools and tool calls
(`tool_calls`) and stop strings cut as the text streams (`stop_strings`)."""
