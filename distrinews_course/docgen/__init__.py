"""The README's and docs/'s generated parts: what the chapters teach and how long they ran, the layout of the tree,
the tables of the benchmarks' records, and the check that every figure stated there is one a record holds.

scripts/make_docs.py rewrites every block between `<!-- generated: NAME -->` and `<!-- end: NAME -->` (blocks.py)
from chapters.py, layout.py and tables.py; figures.py finds the figures a page states and the records that hold them.
"""
