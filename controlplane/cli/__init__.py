"""`epochal`: the command line for what users do from a shell (jobs, operations, the store).

One implementation per verb (`jobs.py`, `operations.py`, `store.py`); `manage.py` keeps thin
wrappers of the same verbs for scripts written against it, and Django's own commands. See
docs/control-plane.md, "CLI"."""
