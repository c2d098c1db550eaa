"""The canary judge: a canary version against the stable one, with a score and a verdict (docs/canary.md)."""
