"""Presentation layer: what the notebooks show.

Holds plotly figures over a ``StepTrace`` (``figures``, ``balance_figures``, ``rollout_figures``) and of the rollout
engine (``engine_figures``), ipywidgets
panels (``panels``, ``balance_panels``, ``trainer_panels``), small computations the notebooks need
(``lessons``) and the JupyterLab settings ``make lab`` writes (``jupyter_settings``). May import every layer
below it; nothing imports it except notebooks.
"""
