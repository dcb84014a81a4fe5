"""sandwich.bench: benchmarks of sandwichc against its peers and baseline compilers."""
