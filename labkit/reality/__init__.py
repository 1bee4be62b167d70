"""The reality corpus and the agreement report: public cases of what real GPUs did with verl (``corpus``), each asked
of ``labkit memory`` as its user would ask it (``ask``) and scored against what happened (``score``, ``report``).

The top layer: it runs the command line in-process (``labkit.cli``), so an answer here is exactly what a user gets.
"""
