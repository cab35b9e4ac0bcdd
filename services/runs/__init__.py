"""Run storage, the services' bottom floor: files written atomically and read as data
(`files.py`), run directories and their locks (`run_dir.py`), checkpoints (`checkpoints.py`),
metrics sinks (`sinks.py`), sweep records (`sweep_records.py`), the metric catalog and the entry
sections of a config (`metric_keys.py`, `config_sections.py`), and the stop signals
(`signals.py`). Nothing here starts Ray or trains; everything above stands on it."""
