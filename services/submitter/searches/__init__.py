"""Hyperparameter searches: trials are ordinary jobs; a driver in the submitter starts and prunes them."""
