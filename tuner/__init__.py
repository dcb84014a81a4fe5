"""sandwich.tuner."""
