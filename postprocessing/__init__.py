"""Detokenization for the ensemble's last stage, whole or incremental (``detokenize``)."""
