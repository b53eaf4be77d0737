"""Training loops: `rk.Model`, the epoch stream and its pipeline stages."""
