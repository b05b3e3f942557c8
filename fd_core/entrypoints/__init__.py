"""Entry points: the offline ``LLM`` API, the OpenAI server and the CLI.

Owns user-facing argument parsing and the processes' main functions.
May import every other fd_core component.
"""
