"""Top layer: the reality corpus and the agreement report.

Public, cited cases of what real GPUs did with verl (``case``: the records; ``corpus``: read and checked from
``data/reality/*.yaml``), each asked of ``labkit
memory`` as its user would ask it, in this process (``ask``), and scored against what happened: the verdict, the
phase, and a log's memory counter (``score``), in words and as the README's table (``report``).
May import: ``labkit.cli`` and everything below it (it runs the command line, so an answer here is exactly what a
user gets); nothing imports it but the benchmark, the tests and the notebooks.
"""
