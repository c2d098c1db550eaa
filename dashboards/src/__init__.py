"""One module per dashboard, each with a ``build()``; ``common`` holds what they share."""
