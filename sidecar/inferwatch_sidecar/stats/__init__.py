"""Statistics every component shares: numpy and scipy only, no sidecar imports (the bottom layer).

- :mod:`.hypothesis`: two-sample tests and distances on samples and bin counts (KS, chi-squared,
  Mann-Whitney on bins, two-proportion z, PSI, Jensen-Shannon, Wasserstein, Benjamini-Hochberg); the drift
  engine, the canary judge and tail attribution use them.
- :mod:`.columns`: reference columns, the bounded summaries of one sample (percentile bins, top-K
  categories), and :func:`~.columns.canon`, the one spelling of a category offline and live;
- :mod:`.compare`: two samples compared column by column on those bins (tests, effect sizes, their noise
  floors, Benjamini-Hochberg): the drift engine's per-column decision, which tail attribution shares;
- :mod:`.quantiles`: quantiles of binned histograms and the normal quantile function.
- :mod:`.trend`: robust trend estimators (Theil-Sen slope with Sen's interval, the Mann-Kendall test).
"""
