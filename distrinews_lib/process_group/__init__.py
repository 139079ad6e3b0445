"""A process in torch's process group, one concern a module: setup.py (who it is, as torchrun said; which backend and
device), ranks.py (its rank, and printing on rank 0), collectives.py (what every rank calls together) and ending.py
(leaving without the interpreter's teardown). The scripts reach all four through distributed.py."""
