"""The study reports of ``scripts/imagenette_study.py``, kept out of the library users import: a study's runs and
evaluations as tables read them (``results``), the goal its RoPE arms are held to (``goal``), its seed-merged tables,
plots and verdict (``report``), every study side by side (``compare``), and accuracy over a run's schedule
(``course``)."""
