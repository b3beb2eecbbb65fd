"""Planning: who averages with whom, iteration by iteration, from a topology (pure numpy, no process groups)."""
