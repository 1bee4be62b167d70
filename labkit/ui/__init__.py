"""Presentation layer: what the notebooks show.

Holds plotly figures over a ``StepTrace`` (``figures``, ``balance_figures``, ``rollout_figures``, the rollout engine's ``engine_figures``; their shared look
and fast construction in ``figure_style``), ipywidgets panels (``panels``, ``balance_panels``, ``trainer_panels``,
built from ``panel_parts``; a live run's status line in ``live_status``), verl's verdict as a card and the check
that a demonstrated error occurs (``verdict``), the paste box that reads a failed run's log (``diagnose_panel``), HTML tables (``html_table``, ``plan_tables``), the start-here
dashboard (``dashboard``: state, view, figures, its memory inputs in ``dashboard_memory``, the thread that plans
the latest input in ``latest_worker``; ``suite``: the notebook map), the blog posts' claims checked by
running labkit (``seed_claims``, notebook 09), small computations the notebooks need (``lessons``), and the lab's
setup: the JupyterLab and server settings ``make venv`` writes (``jupyter_settings``), ``make lab``'s launcher
(``lab_server``), the notebook git filter and save hook (``notebook_filter``). May import every layer below it;
nothing imports it except notebooks.
"""
