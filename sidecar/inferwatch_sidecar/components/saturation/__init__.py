"""What bounds a model version now: one saturation verdict from GPM, engine state and the serving process CPU."""
