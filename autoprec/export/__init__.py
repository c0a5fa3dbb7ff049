"""Production artifacts from a result directory."""
