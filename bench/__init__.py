"""``make bench``: one run, one machine, the engine side by side with its alternatives
(bench/cli.py), ending with the targets' PASS / FAIL; the engines are used through their public
API only, so the benchmark keeps working while their internals change."""
