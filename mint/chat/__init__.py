"""Chat: conversations in OpenAI's format, shared by the trainer, evals and serving.

`messages` reads a message's text and calls, `tool_calls` holds the call type and Mint's text
form of calls, `rows` checks dataset rows, `render` renders conversations with a base's chat
template, `text` normalizes short answers for comparison and `patterns` compiles user-supplied
regular expressions on a linear-time engine (RE2), for graders and mixture routers alike.
Plain text and JSON (pydantic, and RE2 for patterns): nothing here imports torch or a tokenizer
library (`render` takes the tokenizer as an argument), so the API process validates rows with
it, and every layer that reads or writes a conversation agrees on one form. Below every other
Mint package: it imports none but `mint.errors` and `mint.config`.
"""
