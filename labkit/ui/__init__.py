"""Presentation layer: what the notebooks show.

Holds plotly figures over a ``StepTrace`` (``figures``, ``balance_figures``, ``rollout_figures``), ipywidgets
panels (``panels``, ``balance_panels``, ``trainer_panels``), small computations the notebooks need
(``lessons``), and the lab's setup: the JupyterLab and server settings ``make venv`` writes (``jupyter_settings``),
``make lab``'s launcher (``lab_server``), the notebook git filter and save hook (``notebook_filter``). May import
every layer below it; nothing imports it except notebooks.
"""
