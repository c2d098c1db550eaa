"""Training-serving skew: served feature values joined with what the training pipeline computes for the same requests.

- :mod:`.tables` reads CSV and Parquet files or folders into Arrow tables;
- :mod:`.diagnose` joins them on a key and names the kind of each feature's disagreement;
- :mod:`.component` is the live join (``POST /v1/skew``, ``inferwatch.record_offline()``);
- :mod:`.writer` keeps a sample of the served rows in rotating Parquet files.

See docs/skew.md.
"""
