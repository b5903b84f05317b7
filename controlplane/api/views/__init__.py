"""API views by domain: thin handlers that parse, call one service or selector, render."""
