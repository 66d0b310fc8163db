"""Command-line tools: qdump, qpack and the load tests."""
