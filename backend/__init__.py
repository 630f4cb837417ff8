"""Pieces the Triton python-backend adapters (``model_repository/*/1/model.py``) share.

Everything here runs inside Triton's python backend stub and may import
``triton_python_backend_utils``; launchers and clients never import it. The adapters stay thin:
they read tensors with :mod:`backend.io`, hand them to the plain packages (``preprocessing``,
``engine``, ``postprocessing``), and answer through :mod:`backend.io` again.
"""
