"""`rredcot study`: measure credit methods against Monte Carlo on traces of a named policy."""
