"""sandwich.dsl."""
