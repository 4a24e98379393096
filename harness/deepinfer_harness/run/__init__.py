"""Run stage: the only code that starts servers and sends traffic."""
