"""Client side of the code-completion ensemble: the tensor contract, a library and a command."""
