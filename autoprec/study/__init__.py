"""The search over plans: the Optuna study, the sensitivity pass and warm start, many workers on one
study."""
