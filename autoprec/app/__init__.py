"""The verbs as pipelines and the command line."""
