"""One module per operation kind; `controlplane.operations.registry` lists them."""
