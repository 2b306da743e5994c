"""The study reports of ``scripts/imagenette_study.py``, kept out of the library users import: seed-merged tables,
plots and the verdict of one study (``report``), every study side by side (``compare``), and accuracy over a run's
schedule (``course``)."""
