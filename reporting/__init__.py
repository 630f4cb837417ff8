"""What every tool (load test, soak, benchmark) shares: the Triton it measures
(:mod:`.triton`), this machine (:mod:`.machine`), the request ledger (:mod:`.events`), tables and
charts. It imports only ``contract`` and ``serving`` of the project, so every tool may import it."""
