"""sandwich.topology."""
