"""Tokenization for the ensemble's first stage (``tokenize``) and the word-list layout."""
