"""Statistics every component shares: numpy and scipy only, no sidecar imports (the bottom layer).

- :mod:`.hypothesis`: two-sample tests and distances on samples and bin counts (KS, chi-squared,
  Mann-Whitney on bins, two-proportion z, PSI, Jensen-Shannon, Wasserstein, Benjamini-Hochberg); the drift
  engine, the canary judge and tail attribution use them.
- :mod:`.quantiles`: quantiles of binned histograms and the normal quantile function.
- :mod:`.trend`: robust trend estimators (Theil-Sen slope with Sen's interval, the Mann-Kendall test).
"""
