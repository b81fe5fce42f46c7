"""Background jobs that run beside or apart from the API: expiry sweep, fan-out, delivery."""
