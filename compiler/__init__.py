"""sandwich.compiler."""
