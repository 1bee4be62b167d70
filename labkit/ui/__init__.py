"""Presentation layer: what the notebooks show.

Holds plotly figures over a ``StepTrace`` (``figures``, ``balance_figures``, ``rollout_figures``), ipywidgets
panels (``panels``, ``balance_panels``, ``trainer_panels``), small computations the notebooks need
(``lessons``), the blog posts' claims checked by running labkit (``seed_claims``, notebook 09) and the JupyterLab
settings ``make lab`` writes (``jupyter_settings``). May import every layer below it; nothing imports it except
notebooks.
"""
