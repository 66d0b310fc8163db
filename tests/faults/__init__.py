"""
The fault harness: real servers under load while journal writes or fsyncs
fail (C{strace} injection) or the disk is full (a small tmpfs), checked with
a ledger of every add, delivery and confirmation. C{python -m tests.faults
--help}; the CI run is C{tests/faults/test_faults.py}; docs/reliability.md
("Faults") says what is checked.
"""
