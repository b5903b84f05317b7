"""`python -m bench.sinks`: each sink's cost (one module per destination kind, each with a
``measure(*, records_per_epoch, epochs, workdir) -> dict``)."""
