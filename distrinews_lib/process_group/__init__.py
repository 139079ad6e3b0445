"""A process in the process group, a module per concern (setup, ranks, collectives, ending): setup.py (who it is, as
torchrun said; which backend and device), ranks.py (its rank, and printing on rank 0), collectives.py (what every rank
calls together) and ending.py (leaving without the interpreter's teardown). The scripts reach all four through
distributed.py."""
