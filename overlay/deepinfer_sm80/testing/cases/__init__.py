"""Each op's cases in one module: named shapes, the input builder, what a test or bench runs them with."""
